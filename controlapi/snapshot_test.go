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
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/manifest"
)

// rawEdgeClient is a plain HTTP client with the identity enrolled into
// dir, for what controlclient does not expose (headers, partial reads).
func (e *env) rawEdgeClient(t testing.TB, dir string) *http.Client {
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
func publishBig(t testing.TB, e *env, n, size int) {
	t.Helper()
	raw := make([]byte, size*3/4)
	for i := 0; i < n; i++ {
		rand.Read(raw)
		name := fmt.Sprintf("big%03d.example.com", i)
		cfg := fmt.Sprintf(`{"hostnames":["%s"],"routes":[{"prefix":"/","respond":{"status":200,"body":"%s"}}]}`, name, base64.StdEncoding.EncodeToString(raw))
		if _, err := e.admin.Publish(ctx(t), name, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(cfg)}); err != nil {
			t.Fatal(err)
		}
	}
}

// memSample is the process's Go heap in use and its resident set, MiB.
func memSample(t testing.TB) (heap, rss float64) {
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

// downloadConcurrently downloads the edge's snapshot n times at once and
// returns the bytes of one (all must be equal), sampling the process's Go
// heap and resident set meanwhile: what the downloads added at their peak.
func downloadConcurrently(tb testing.TB, e *env, dir string, n int) (size int64, heapAdded, rssAdded float64) {
	tb.Helper()
	hc := e.rawEdgeClient(tb, dir)
	goruntime.GC()
	heap0, rss0 := memSample(tb)
	var peakHeap, peakRSS float64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			h, r := memSample(tb)
			peakHeap, peakRSS = max(peakHeap, h), max(peakRSS, r)
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	sums := make([]string, n)
	sizes := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx(tb), http.MethodGet, e.edgeURL+edgeapi.PathSnapshot, nil)
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
			tb.Fatalf("download %d: %v", i, err)
		}
		if sums[i] != sums[0] {
			tb.Fatalf("download %d differs from download 0", i)
		}
	}
	return sizes[0], peakHeap - heap0, peakRSS - rss0
}

// Sixteen edges of a fleet recovering at once download a snapshot together:
// the control API builds it once and serves the same file to all, whole and
// verifiable. (Its memory is measured by BenchmarkSnapshotDownloads16.)
func TestSnapshotServedWholeToConcurrentDownloads(t *testing.T) {
	e := serveWith(t, filepath.Join(t.TempDir(), "control.db"), make([]byte, 32), oneEdgeIsAFleet)
	edge := e.createEdge(t, "recovering")
	_, id, dir := e.enroll(t, edge.Token)
	publishBig(t, e, 12, 100<<10)
	if size, _, _ := downloadConcurrently(t, e, dir, 16); size == 0 {
		t.Fatal("an empty snapshot")
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
	if len(s.Manifest.Entries) != 12 {
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

// oneEdgeIsAFleet lets one edge stand for sixteen edges of sixteen orgs:
// its downloads are not held to an edge's or an org's share.
func oneEdgeIsAFleet(o *controlapi.Options) { o.SnapshotPerEdge, o.SnapshotPerOrg = 16, 16 }

// BenchmarkSnapshotDownloads16: sixteen edges download a ~66 MiB (90 MiB of
// configuration) snapshot at once; it reports what the control API's Go
// heap and resident set grew by at their peak (target: under 64 MiB).
// Before, each download built the whole snapshot in memory: about 820 MiB
// more for sixteen.
func BenchmarkSnapshotDownloads16(b *testing.B) {
	e := serveWith(b, filepath.Join(b.TempDir(), "control.db"), make([]byte, 32), oneEdgeIsAFleet)
	edge := e.createEdge(b, "recovering")
	_, _, dir := e.enroll(b, edge.Token)
	publishBig(b, e, 90, 1000<<10)
	var size int64
	var heap, rss float64
	for b.Loop() {
		s, h, r := downloadConcurrently(b, e, dir, 16)
		size, heap, rss = s, max(heap, h), max(rss, r)
	}
	b.ReportMetric(float64(size)/(1<<20), "MiB-snapshot")
	b.ReportMetric(heap, "MiB-heap-added")
	b.ReportMetric(rss, "MiB-rss-added")
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
