package controlapi_test

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/manifest"
)

// rawEdgeClient is a plain HTTP client with the identity enrolled into
// dir, for what controlclient does not expose (headers, partial reads).
func (e *env) rawEdgeClient(t *testing.T, dir string) *http.Client {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "identity", controlclient.CertFile), filepath.Join(dir, "identity", controlclient.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
	tr := &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS12}, MaxConnsPerHost: 0}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// publishBig publishes n domains of about size bytes of configuration
// each, incompressible, to shared-default.
func publishBig(t *testing.T, e *env, n, size int) {
	t.Helper()
	raw := make([]byte, size*3/4)
	for i := 0; i < n; i++ {
		rand.Read(raw)
		name := fmt.Sprintf("big%03d.example.com", i)
		cfg := fmt.Sprintf(`{"hostnames":["%s"],"routes":[{"prefix":"/","respond":{"status":200,"body":"%s"}}]}`, name, base64.StdEncoding.EncodeToString(raw))
		if _, err := e.admin.Publish(ctx(t), name, controlapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(cfg)}); err != nil {
			t.Fatal(err)
		}
	}
}

// memSample is the process's Go heap in use and its resident set, MiB.
func memSample(t *testing.T) (heap, rss float64) {
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			rss = kb / 1024
		}
	}
	return float64(ms.HeapInuse) / (1 << 20), rss
}

// Sixteen edges of a fleet recovering at once download a ~90 MiB snapshot
// together: the control API builds it once, serves it from a file, and its
// memory grows by far less than 64 MiB. Before, each download built the
// whole snapshot in memory: about 820 MiB more for sixteen.
func TestSnapshotServedFromDiskInBoundedMemory(t *testing.T) {
	if testing.Short() || raceDetector {
		t.Skip("a measurement: publishes 90 MiB of configuration; run without -race and -short")
	}
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	edge := e.createEdge(t, "recovering")
	_, id, dir := e.enroll(t, edge.Token)
	publishBig(t, e, 90, 1000<<10)
	hc := e.rawEdgeClient(t, dir)

	goruntime.GC()
	heap0, rss0 := memSample(t)
	var peakHeap, peakRSS float64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			h, r := memSample(t)
			peakHeap, peakRSS = max(peakHeap, h), max(peakRSS, r)
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	const downloads = 16
	sums := make([]string, downloads)
	sizes := make([]int64, downloads)
	errs := make([]error, downloads)
	var wg sync.WaitGroup
	for i := range downloads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx(t), http.MethodGet, e.edgeURL+edgeapi.PathSnapshot, nil)
			resp, err := hc.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs[i] = fmt.Errorf("HTTP %d", resp.StatusCode)
				return
			}
			h := sha256.New()
			sizes[i], errs[i] = io.Copy(h, resp.Body)
			sums[i] = fmt.Sprintf("%x", h.Sum(nil))
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	for i, err := range errs {
		if err != nil {
			t.Fatalf("download %d: %v", i, err)
		}
		if sums[i] != sums[0] {
			t.Fatalf("download %d differs from download 0", i)
		}
	}
	t.Logf("16 concurrent downloads of a %.1f MiB snapshot: Go heap in use %.1f → peak %.1f MiB (+%.1f), RSS %.1f → peak %.1f MiB (+%.1f)",
		float64(sizes[0])/(1<<20), heap0, peakHeap, peakHeap-heap0, rss0, peakRSS, peakRSS-rss0)
	if sizes[0] < 60<<20 {
		t.Fatalf("snapshot of %d bytes: not the large one this measures", sizes[0])
	}
	if peakHeap-heap0 > 64 || peakRSS-rss0 > 64 {
		t.Errorf("16 downloads added %.1f MiB of heap, %.1f MiB of RSS: over 64 MiB", peakHeap-heap0, peakRSS-rss0)
	}

	// What was served is the edge's snapshot, whole and verified.
	rc, err := e.client(t, dir).Snapshot(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	s, err := manifest.ReadSnapshot(ctx(t), rc, manifest.SnapshotLimit, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pub, _ := base64.StdEncoding.DecodeString(e.srv.PublicKey())
	if len(s.Manifest.Entries) != 90 {
		t.Fatalf("%d entries", len(s.Manifest.Entries))
	}
	for _, en := range s.Manifest.Entries {
		data, err := s.Artifact(ctx(t), en.SHA256)
		if err == nil {
			err = en.Verify(pub, id.EdgeID, data)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Beyond its bound of concurrent snapshot downloads a replica answers 503
// with Retry-After, which the agent retries like any failed poll; a new
// sequence gets a new snapshot.
// On SQLite only: building and serving are the same on PostgreSQL
// (TestManifestPollingArtifactsSnapshotAndAcks serves a snapshot from both).
func TestSnapshotDownloadsAreBounded(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		e := serveWith(t, filepath.Join(t.TempDir(), "control.db"), make([]byte, 32), func(o *controlapi.Options) { o.SnapshotDownloads = 1 })
		edge := e.createEdge(t, "a")
		_, _, dir := e.enroll(t, edge.Token)
		// Bigger than what loopback socket buffers hold, so that the first
		// download is still being served while its answer is not read.
		publishBig(t, e, 24, 1000<<10)
		hc := e.rawEdgeClient(t, dir)
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodGet, e.edgeURL+edgeapi.PathSnapshot, nil)
		first, err := hc.Do(req)
		if err != nil || first.StatusCode != http.StatusOK {
			t.Fatalf("first download: %v", err)
		}
		// The first download is under way (its answer not read): the second
		// is refused, with when to retry.
		resp, err := hc.Get(e.edgeURL + edgeapi.PathSnapshot)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("second download: HTTP %d, Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		_, err = e.client(t, dir).Snapshot(ctx(t))
		var he *controlclient.HTTPError
		if !errors.As(err, &he) || !he.Retryable() {
			t.Errorf("the agent's client: %v, want a retryable refusal", err)
		}
		io.Copy(io.Discard, first.Body)
		first.Body.Close()
		// Once it is done, downloads are served again; a new sequence is a
		// new snapshot.
		snap := func() manifest.Manifest {
			rc, err := e.client(t, dir).Snapshot(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			s, err := manifest.ReadSnapshot(ctx(t), rc, manifest.SnapshotLimit, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			return s.Manifest
		}
		m1 := snap()
		publish(t, e, "later.example.com", "later")
		m2 := snap()
		if len(m1.Entries) != 24 || len(m2.Entries) != 25 || m2.Sequence <= m1.Sequence {
			t.Errorf("snapshots at %d (%d entries) then %d (%d entries)", m1.Sequence, len(m1.Entries), m2.Sequence, len(m2.Entries))
		}
	})
}
