package supervisor_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/internal/procstat"
	"cellvisor/internal/testcert"
	"cellvisor/runtime"
	"cellvisor/testkit/testutil"
)

// certDomains are n domains d<i>.tls.test of shared-default, each with its
// own certificate (ECDSA P-256, from ca), answering "rev <rev>".
func certDomains(b testing.TB, ca *testcert.CA, n int, rev int64) ([]domain.Domain, map[string][]byte) {
	ds := make([]domain.Domain, 0, n)
	keys := make(map[string][]byte, n)
	for i := 0; i < n; i++ {
		name := "d" + strconv.Itoa(i) + ".tls.test"
		chain, key := ca.Issue(b, time.Time{}, name)
		fp, err := domain.ChainFingerprint(chain)
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, domain.Domain{Domain: name, Pool: domain.PoolSharedDefault, Revision: rev, Hostnames: []string{name},
			Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: "rev " + strconv.FormatInt(rev, 10)}}},
			TLS:    &domain.TLS{Certificate: "c" + strconv.Itoa(i), Chain: chain, Fingerprint: fp}})
		keys[name] = []byte(key)
	}
	return ds, keys
}

// BenchmarkTLS measures a cell's HTTPS against a bare nginx serving the
// same certificate with the same protocols, ciphers and session cache, one
// worker each, in the same run: full (TLS 1.3) and resumed (TLS 1.2)
// handshakes (the serving
// worker's CPU per handshake, and handshakes per second; the cell at its
// 0.5 CPU limit, the bare nginx unlimited), with 1,000 certificates in the
// cell; then the cell's load of a release with 1,000 new certificates (its
// own load time, its worker's Lua heap) and a reload with them (the time
// until the new worker generation serves, its worker's resident memory).
func BenchmarkTLS(b *testing.B) {
	ca := testcert.NewCA(b)
	const n = 1000
	ds, keys := certDomains(b, ca, n, 1)
	h := newHarness(b, harnessOpts{slots: 1, domains: ds, keys: keys})
	cellPort := h.waitReady("cell-01", 0).HTTPSPort
	api := privateClient(b, h, "cell-01", nil)
	cellWorker := cellStatus(b, api).WorkerPID

	// The bare nginx presents d0's certificate, as a hand-written server.
	dir := b.TempDir()
	testutil.Traversable(b, dir)
	pemPath := filepath.Join(dir, "d0.pem")
	if err := os.WriteFile(pemPath, append([]byte(ds[0].TLS.Chain), keys[ds[0].Domain]...), 0o644); err != nil {
		b.Fatal(err)
	}
	ngxPort, ngxWorker := startNginx(b, h.bin, func(root string, port int) string {
		return fmt.Sprintf(`events { worker_connections 1024; }
http {
    access_log off;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_ciphers ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305;
    ssl_session_cache shared:bare:2m;
    ssl_session_tickets off;
    server {
        listen 127.0.0.1:%[1]d ssl http2;
        server_name d0.tls.test;
        ssl_certificate %[2]s;
        ssl_certificate_key %[2]s;
        location / { return 200 "rev 1\n"; }
    }
}
`, port, pemPath)
	})

	for _, resumed := range []bool{false, true} {
		kind := "full"
		if resumed {
			kind = "resumed"
		}
		for _, side := range []struct {
			name         string
			port, worker int
		}{{"cell", cellPort, cellWorker}, {"nginx", ngxPort, ngxWorker}} {
			b.Run("handshake-"+kind+"/"+side.name, func(b *testing.B) {
				cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "d0.tls.test"}
				if resumed {
					cfg.ClientSessionCache = tls.NewLRUClientSessionCache(8)
				}
				// What a request costs the worker on a kept-alive
				// connection: taken off each connection's figure, which
				// has one (in TLS 1.3 the session to resume comes after
				// the handshake, read with the answer to a request).
				perRequest := keptRequests(b, side.port, cfg, side.worker, 2000)
				handshakes(b, side.port, cfg, 64, resumed) // warm, and the session to resume
				cpu0 := workerCPU(b, side.worker)
				t0 := time.Now()
				b.ResetTimer()
				handshakes(b, side.port, cfg, b.N, resumed)
				b.StopTimer()
				took := time.Since(t0)
				perConn := float64((workerCPU(b, side.worker) - cpu0).Microseconds()) / float64(b.N)
				b.ReportMetric(perConn, "worker-µs/conn")
				b.ReportMetric(perConn-perRequest, "worker-µs/handshake")
				b.ReportMetric(float64(b.N)/took.Seconds(), "handshakes/s")
			})
		}
	}

	b.Run("load-1000-certs", func(b *testing.B) {
		seq := int64(1)
		var ms, kb int64
		for b.Loop() {
			b.StopTimer()
			seq++
			next, nextKeys := certDomains(b, ca, n, seq)
			h.keys = nextKeys
			h.activate(seq, next)
			b.StartTimer()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			how, err := h.sup.Apply(ctx, "cell-01")
			cancel()
			if err != nil || how != "loaded" {
				b.Fatalf("apply: %s %v", how, err)
			}
			b.StopTimer()
			st := cellStatus(b, api)
			ms += st.Loads.LastMs
			kb = max(kb, st.LuaKB)
			b.StartTimer()
		}
		b.ReportMetric(float64(ms)/float64(b.N), "cell-load-ms")
		b.ReportMetric(float64(kb)/1024, "lua-heap-MiB")
	})

	b.Run("reload-1000-certs", func(b *testing.B) {
		seq := int64(1000)
		var rss int64
		for b.Loop() {
			seq++
			timeout := 10 + int(seq%2) // a shape change: a reload
			h.activateWith(seq, ds, func(p *runtime.RenderParams) { p.ClientHeaderTimeout = timeout })
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			how, err := h.sup.Apply(ctx, "cell-01")
			cancel()
			if err != nil || !strings.HasPrefix(how, "reloaded") {
				b.Fatalf("apply: %s %v", how, err)
			}
			b.StopTimer()
			rss = max(rss, workerRSS(b, cellStatus(b, api).WorkerPID))
			b.StartTimer()
		}
		b.ReportMetric(float64(rss)/(1<<20), "worker-rss-MiB")
	})
}

// handshakes makes n TLS handshakes to port over 4 connections at a time,
// each on a new connection that asks for / and is closed once answered;
// every one must succeed (and resume, where resumed).
func handshakes(b *testing.B, port int, cfg *tls.Config, n int, resumed bool) {
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	per := (n + 3) / 4
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := tls.Dialer{Config: cfg, NetDialer: &net.Dialer{Timeout: 5 * time.Second}}
			for i := 0; i < per; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				c, err := d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(port))
				cancel()
				if err != nil {
					errs <- err
					return
				}
				// One request on it, read to its end: what a client does,
				// and in TLS 1.3 what brings it the session to resume.
				err = request(c, cfg.ServerName, true)
				did := c.(*tls.Conn).ConnectionState().DidResume
				c.Close()
				if err != nil {
					errs <- err
					return
				}
				if resumed && !did && i > 0 {
					errs <- fmt.Errorf("a handshake did not resume")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// request sends GET / for host on c and reads the answer (to its end
// where closing).
func request(c net.Conn, host string, closing bool) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	conn := ""
	if closing {
		conn = "Connection: close\r\n"
	}
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n"+conn+"\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("GET https://%s/: %s", host, resp.Status)
	}
	return err
}

// keptRequests sends n requests over 4 kept-alive TLS connections and
// answers the worker's CPU per request, in µs.
func keptRequests(b *testing.B, port int, cfg *tls.Config, worker, n int) float64 {
	conns := make([]net.Conn, 4)
	readers := make([]*bufio.Reader, 4)
	for i := range conns {
		c, err := tls.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port), cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[i], readers[i] = c, bufio.NewReader(c)
	}
	cpu0 := workerCPU(b, worker)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < n/4; j++ {
				_ = conns[i].SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(conns[i], "GET / HTTP/1.1\r\nHost: "+cfg.ServerName+"\r\n\r\n"); err != nil {
					errs <- err
					return
				}
				resp, err := http.ReadResponse(readers[i], nil)
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64((workerCPU(b, worker) - cpu0).Microseconds()) / float64(n/4*4)
}

// workerRSS is a process's resident memory, in bytes.
func workerRSS(b *testing.B, pid int) int64 {
	f, err := procstat.Fields(pid)
	if err != nil {
		b.Fatal(err)
	}
	pages, _ := strconv.ParseInt(f[21], 10, 64) // rss, field 24 (Fields starts at field 3)
	return pages * int64(os.Getpagesize())
}
