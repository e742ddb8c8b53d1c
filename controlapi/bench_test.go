package controlapi_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/pki"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
	"cellvisor/testkit/testutil"
)

// The poll benchmarks measure the control plane's cheapest and most frequent
// request: a manifest poll when nothing changed, from a fleet of enrolled
// edges on keep-alive mutual-TLS connections, against the floor of a bare Go
// TLS handler answering an empty 200 on the same machine. Target: at least
// half the floor's polls/s, and a p99 under 20 ms.
//
// One driver serves all of them: pollWorkers goroutines, worker w polling
// edges w, w+pollWorkers, … in turn, until b.N polls are done in all. Every
// edge has its own http.Transport: its own client certificate and one
// keep-alive HTTP/1.1 connection over TLS 1.3, opened before the timer
// starts (more than 1% of polls opening a new one fails the benchmark). With
// pollWorkers polls always in flight, latency is mostly queueing: p50 ≈
// pollWorkers ÷ polls/s.
const (
	benchEdges = 1000
	// pollWorkers saturates 2 cores with either server: 25 already does,
	// 10 does not; past 100 the throughput stays and only the queue grows.
	pollWorkers = 50
	// setupWorkers create and enroll the edges.
	setupWorkers = 8

	benchAdminToken = "bench-admin-token-0123456789abcdef"
	benchDomain     = "bench.example.test"
	benchConfig     = `{"hostnames":["bench.example.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"x"}}]}`
)

// BenchmarkPollsUnchanged: benchEdges enrolled edges, each at manifest
// sequence 1, polling GET /v1/manifest?after=1 with If-None-Match: "1"; each
// answer must be 304. The control API is served as Serve serves it, with
// Run keeping its cache and last-seen times, on SQLite and on PostgreSQL.
func BenchmarkPollsUnchanged(b *testing.B) {
	// A b.N benchmark function runs with b.N = 1 first, then again for every
	// -count: each fleet is made on its sub-benchmark's first run and kept,
	// with its database, until this parent ends.
	dsns := map[string]string{store.SQLite: filepath.Join(b.TempDir(), "control.db")}
	if os.Getenv(testutil.PostgresEnv) != "" {
		dsns[store.Postgres] = testutil.Postgres(b)
	}
	for _, name := range []string{store.SQLite, store.Postgres} {
		var f *simFleet
		b.Run(name, func(sb *testing.B) {
			dsn, ok := dsns[name]
			if !ok {
				testutil.Postgres(sb) // skips, saying why
			}
			if f == nil {
				var err error
				if f, err = controlFleet(sb.Context(), b.Cleanup, dsn); err != nil {
					sb.Fatal(err)
				}
			}
			f.run(sb)
		})
	}
}

// BenchmarkPollFloor: the same fleet and driver against a bare Go TLS
// server (the same http.Server settings, TLS 1.3, a server certificate and
// client certificates from a CA of the same kind, client certificates
// required and verified) whose handler writes an empty 200 to GET /.
func BenchmarkPollFloor(b *testing.B) {
	f, err := floorFleet(b.Cleanup)
	if err != nil {
		b.Fatal(err)
	}
	f.run(b)
}

// controlFleet opens the store at dsn, serves a control API on it, publishes
// one domain to shared-default and creates and enrolls benchEdges edges,
// each at sequence 1. cleanup tears it all down.
func controlFleet(ctx context.Context, cleanup func(func()), dsn string) (*simFleet, error) {
	st, err := store.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	cleanup(func() { st.Close() })
	seal := make([]byte, 32)
	rand.Read(seal)
	srv, err := controlapi.New(ctx, controlapi.Options{Store: st, SealKey: seal, AdminToken: benchAdminToken})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); srv.Run(runCtx) }()
	cleanup(func() { stop(); <-ran })
	edgeURL, err := serveLoopbackTLS(cleanup, srv.EdgeHandler(), srv.EdgeTLSConfig())
	if err != nil {
		return nil, err
	}
	adminURL, err := serveLoopback(cleanup, srv.AdminHandler())
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(srv.CAPEM()))
	hc := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots}, MaxIdleConnsPerHost: setupWorkers}}
	defer hc.CloseIdleConnections()
	admin := &adminapi.Client{URL: adminURL, Token: benchAdminToken, HTTP: hc}
	if _, err := admin.Publish(ctx, benchDomain, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(benchConfig)}); err != nil {
		return nil, fmt.Errorf("publish %s: %w", benchDomain, err)
	}
	certs := make([]tls.Certificate, benchEdges)
	err = inParallel(setupWorkers, benchEdges, func(i int) (err error) {
		certs[i], err = enrollEdge(ctx, admin, hc, edgeURL, fmt.Sprintf("bench-%04d", i))
		return err
	})
	if err != nil {
		return nil, err
	}
	return newFleet(cleanup, edgeURL+edgeapi.PathManifest+"?after=1", http.Header{"If-None-Match": {`"1"`}},
		http.StatusNotModified, roots, certs)
}

// enrollEdge creates an edge and enrolls it as an agent does: a new ECDSA
// P-256 key and a CSR, sent with the bootstrap token to the enroll endpoint.
func enrollEdge(ctx context.Context, admin *adminapi.Client, hc *http.Client, edgeURL, name string) (tls.Certificate, error) {
	created, err := admin.CreateEdge(ctx, adminapi.EdgeRequest{Name: name, Org: "bench", Country: "DE", Continent: "EU"})
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create edge %s: %w", name, err)
	}
	if created.Edge.Sequence != 1 {
		return tls.Certificate{}, fmt.Errorf("edge %s created at sequence %d, want 1", name, created.Edge.Sequence)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "cellvisor edge"}}, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	body, _ := json.Marshal(edgeapi.EnrollRequest{
		Token: created.Token, CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}))})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, edgeURL+edgeapi.PathEnroll, bytes.NewReader(body))
	if err != nil {
		return tls.Certificate{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("enroll edge %s: %w", name, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("enroll edge %s: %w", name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return tls.Certificate{}, fmt.Errorf("enroll edge %s: HTTP %d: %s", name, resp.StatusCode, bytes.TrimSpace(data))
	}
	var er edgeapi.EnrollResponse
	if err := json.Unmarshal(data, &er); err != nil {
		return tls.Certificate{}, fmt.Errorf("enroll edge %s: %w", name, err)
	}
	blk, _ := pem.Decode([]byte(er.Certificate))
	if blk == nil {
		return tls.Certificate{}, fmt.Errorf("enroll edge %s: certificate is not PEM", name)
	}
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("enroll edge %s: %w", name, err)
	}
	return tls.Certificate{Certificate: [][]byte{blk.Bytes}, PrivateKey: key, Leaf: leaf}, nil
}

// floorFleet serves the floor's empty 200 and issues benchEdges client
// certificates from its CA.
func floorFleet(cleanup func(func())) (*simFleet, error) {
	now := time.Now()
	ca, _, err := pki.NewCA(now)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	cert, _, err := ca.IssueServer([]string{"127.0.0.1"}, &key.PublicKey, now)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	url, err := serveLoopbackTLS(cleanup, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	}), cfg)
	if err != nil {
		return nil, err
	}
	certs := make([]tls.Certificate, benchEdges)
	err = inParallel(setupWorkers, benchEdges, func(i int) error {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		c, _, err := ca.IssueClient(&x509.CertificateRequest{PublicKey: &k.PublicKey}, fmt.Sprintf("floor-%04d", i), now)
		if err != nil {
			return err
		}
		certs[i] = tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: k, Leaf: c}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return newFleet(cleanup, url+"/", http.Header{}, http.StatusOK, pool, certs)
}

// serveLoopbackTLS serves h over TLS on a loopback port with the
// http.Server settings of Serve's edge-control listener, until cleanup.
func serveLoopbackTLS(cleanup func(func()), h http.Handler, cfg *tls.Config) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	hs := &http.Server{Handler: h, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 60 * time.Second, WriteTimeout: 5 * time.Minute, IdleTimeout: 5 * time.Minute}
	done := make(chan error, 1)
	go func() { done <- hs.ServeTLS(ln, "", "") }()
	cleanup(func() { hs.Close(); <-done })
	return "https://" + ln.Addr().String(), nil
}

// serveLoopback serves h over plain HTTP on a loopback port, until cleanup.
func serveLoopback(cleanup func(func()), h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	cleanup(func() { hs.Close(); <-done })
	return "http://" + ln.Addr().String(), nil
}

// inParallel calls f(0) … f(n-1) from workers goroutines; a worker stops at
// its first error. It returns the errors.
func inParallel(workers, n int, f func(i int) error) error {
	var next atomic.Int64
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if errs[w] = f(i); errs[w] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// simFleet is the simulated edges of a benchmark, all asking the same question
// and expecting the same status.
type simFleet struct {
	want  int
	edges []simEdge
	dials atomic.Int64 // connections the edges opened
}

// simEdge is one edge: its transport (its client certificate, its
// connection) and its request, sent again once the last answer is read.
type simEdge struct {
	tr  *http.Transport
	req *http.Request
}

func newFleet(cleanup func(func()), url string, header http.Header, want int, roots *x509.CertPool, certs []tls.Certificate) (*simFleet, error) {
	f := &simFleet{want: want}
	var http1 http.Protocols
	http1.SetHTTP1(true)
	var d net.Dialer
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		f.dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}
	for _, c := range certs {
		tr := &http.Transport{
			TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, Certificates: []tls.Certificate{c}},
			DialContext:         dial,
			MaxIdleConnsPerHost: 1,
			Protocols:           &http1,
		}
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		f.edges = append(f.edges, simEdge{tr: tr, req: req})
	}
	cleanup(func() {
		for _, e := range f.edges {
			e.tr.CloseIdleConnections()
		}
	})
	return f, nil
}

// poll sends an edge's request and reads the answer, which must have the
// fleet's status.
func (f *simFleet) poll(e simEdge) (*http.Response, error) {
	resp, err := e.tr.RoundTrip(e.req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != f.want {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return resp, fmt.Errorf("GET %s: HTTP %d, want %d: %s", e.req.URL.RequestURI(), resp.StatusCode, f.want, bytes.TrimSpace(data))
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return resp, err
}

// warm polls edge i once, opening its connection if it has none, and checks
// the protocols the timed polls are meant to use.
func (f *simFleet) warm(i int) error {
	resp, err := f.poll(f.edges[i])
	switch {
	case err != nil:
		return fmt.Errorf("warm-up poll of edge %d: %w", i, err)
	case resp.ProtoMajor != 1 || resp.TLS == nil || resp.TLS.Version != tls.VersionTLS13:
		return fmt.Errorf("warm-up poll of edge %d: %s, want HTTP/1.1 over TLS 1.3", i, resp.Proto)
	}
	return nil
}

// run warms every edge's connection, times b.N polls by pollWorkers
// goroutines and reports polls/s and the median and 99th percentile
// latencies.
func (f *simFleet) run(b *testing.B) {
	if err := inParallel(pollWorkers, len(f.edges), f.warm); err != nil {
		b.Fatal(err)
	}
	dialed := f.dials.Load()
	lat := make([]time.Duration, b.N) // one slot per poll, by ticket
	var tickets atomic.Int64
	var stop atomic.Bool
	errs := make([]error, pollWorkers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range pollWorkers {
		var mine []simEdge
		for i := w; i < len(f.edges); i += pollWorkers {
			mine = append(mine, f.edges[i])
		}
		wg.Go(func() {
			<-start
			for i := 0; !stop.Load(); i++ {
				t := tickets.Add(1) - 1
				if t >= int64(b.N) {
					return
				}
				began := time.Now()
				_, err := f.poll(mine[i%len(mine)])
				lat[t] = time.Since(began)
				if err != nil {
					errs[w] = err
					stop.Store(true)
					return
				}
			}
		})
	}
	b.ResetTimer()
	close(start)
	wg.Wait()
	b.StopTimer()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	// net/http's client drops a connection whose request write it hears of
	// over 50 ms after the answer (maxWriteWaitBeforeConnReuse): that happens
	// on an overloaded machine. More than a few of those is keep-alive broken.
	switch n := f.dials.Load() - dialed; {
	case n > int64(b.N)/100:
		b.Fatalf("%d of %d polls opened a new connection: keep-alive did not hold", n, b.N)
	case n > 0:
		b.Logf("%d of %d polls opened a new connection (an overloaded machine?)", n, b.N)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "polls/s")
	b.ReportMetric(percentile(lat, 50), "p50-ms")
	b.ReportMetric(percentile(lat, 99), "p99-ms")
}

// percentile is the nearest-rank p-th percentile of sorted, in
// milliseconds.
func percentile(sorted []time.Duration, p int) float64 {
	i := max((len(sorted)*p+99)/100-1, 0)
	return float64(sorted[i]) / float64(time.Millisecond)
}
