package supervisor_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"cellvisor/domain"
	"cellvisor/internal/testcert"
	"cellvisor/testkit/testutil"
)

// Origins: reached over kept-alive connections, by DNS name, over
// verified TLS.

// countingOrigin is a loopback origin that counts the connections made to
// it and answers "origin <n>" to its n-th request.
func countingOrigin(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var conns, reqs atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "origin %d", reqs.Add(1))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

// Requests to an origin reuse the cell's connections to it: 200 requests
// over a handful, where each used to open its own.
func TestOriginConnectionsAreKeptAlive(t *testing.T) {
	origin, conns := countingOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: originDomain(origin.URL)})
	port := h.waitReady("cell-01", 0).HTTPPort
	const requests = 200
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < requests/4; i++ {
				if code, body, err := get(port, "/x"); err != nil || code != 200 || !strings.HasPrefix(body, "origin ") {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed", failed.Load(), requests)
	}
	if n := conns.Load(); n > 8 {
		t.Errorf("%d requests opened %d connections to the origin; want a handful reused", requests, n)
	}
}

// dnsServer is a loopback DNS server answering A queries for its names
// with a 1 s TTL (the cells keep an answer at least 5 s), NXDOMAIN
// otherwise.
type dnsServer struct {
	mu    sync.Mutex
	addrs map[string]string
	asked atomic.Int64
	addr  string
}

func newDNSServer(t *testing.T) *dnsServer {
	d := &dnsServer{addrs: map[string]string{}}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		d.asked.Add(1)
		m := new(dns.Msg)
		m.SetReply(q)
		name := strings.TrimSuffix(q.Question[0].Name, ".")
		d.mu.Lock()
		ip, ok := d.addrs[name]
		d.mu.Unlock()
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP(ip)})
		}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	return d
}

func (d *dnsServer) set(name, ip string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addrs[name] = ip
}

// An origin given by name is resolved by the cell's resolver: served; the
// name moved to another address is followed once its TTL (at least 5 s)
// ran out; a name that does not resolve answers 502, counted with its
// reason.
func TestOriginByName(t *testing.T) {
	a, _ := countingOrigin(t)
	_, aPort, _ := net.SplitHostPort(a.Listener.Addr().String())
	d := newDNSServer(t)
	d.set("app.origin.test", "127.0.0.1")
	doms := originDomain("http://app.origin.test:" + aPort)
	doms = append(doms, domain.Domain{Domain: "gone.test", Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{"gone.test"},
		Origins: []domain.Origin{{Name: "app", URL: "http://nowhere.origin.test:" + aPort}},
		Routes:  []domain.Route{{Prefix: "/", Origin: "app"}}})
	h := newHarness(t, harnessOpts{slots: 1, domains: doms, resolvers: []string{d.addr}})
	port := h.waitReady("cell-01", 0).HTTPPort
	if code, body, err := get(port, "/"); err != nil || code != 200 || !strings.HasPrefix(body, "origin ") {
		t.Fatalf("by name: %d %q %v", code, body, err)
	}
	if code, _, err := getHost(port, "gone.test", "/"); err != nil || code != 502 {
		t.Errorf("a name that does not resolve: %d %v, want 502", code, err)
	}
	api := privateClient(t, h, "cell-01", nil)
	if o := cellStatus(t, api).Origins["gone.test/app"]; o.Failures != 1 || !strings.Contains(o.LastReason, "NXDOMAIN") {
		t.Errorf("the failure recorded %+v, want one, with the DNS reason", o)
	}
	// The name moves to 127.0.0.2, where another server listens on the
	// same port: followed once the answer's TTL (at least 5 s) ran out.
	listenOn(t, "127.0.0.2:"+aPort, "moved")
	d.set("app.origin.test", "127.0.0.2")
	testutil.Eventually(t, 20*time.Second, func() error {
		if _, body, err := get(port, "/"); err != nil || body != "moved" {
			return fmt.Errorf("%q %v", body, err)
		}
		return nil
	})
}

// listenOn serves body on addr until the test ends.
func listenOn(t *testing.T, addr, body string) *http.Server {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return srv
}

// An https origin is verified against the cells' CA bundle, for its name:
// served; one whose certificate is for another name is refused (502,
// counted) unless its domain turns verification off for it.
func TestOriginTLSIsVerified(t *testing.T) {
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "tls origin") }))
	origin.StartTLS() // its certificate is for example.com and 127.0.0.1
	t.Cleanup(origin.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	cert := origin.TLS.Certificates[0]
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := x509.ParseCertificate(cert.Certificate[0]); err != nil {
		t.Fatal(err)
	}
	no := false
	doms := []domain.Domain{
		tlsDomain("good.test", origin.URL, "example.com", nil),
		tlsDomain("wrong.test", origin.URL, "other.example", nil),
		tlsDomain("insecure.test", origin.URL, "other.example", &no),
	}
	h := newHarness(t, harnessOpts{slots: 1, domains: doms, caFile: ca})
	port := h.waitReady("cell-01", 0).HTTPPort
	for host, want := range map[string]int{"good.test": 200, "wrong.test": 502, "insecure.test": 200} {
		if code, _, err := getHost(port, host, "/"); err != nil || code != want {
			t.Errorf("%s: %d %v, want %d", host, code, err, want)
		}
	}
	api := privateClient(t, h, "cell-01", nil)
	st := cellStatus(t, api)
	if o := st.Origins["wrong.test/app"]; o.Failures != 1 {
		t.Errorf("the refused origin's failures %+v, want 1", o)
	}
}

// An origin with its own CA bundle (ca) is verified against it, not the
// cells' CA bundle: served where its bundle holds its issuer, refused (502,
// counted) where the domain carries none or another, each bundle in a
// location of its own.
func TestOriginOwnCAIsVerified(t *testing.T) {
	private, other, cells := testcert.NewCA(t), testcert.NewCA(t), testcert.NewCA(t)
	chain, key := private.Issue(t, time.Time{}, "origin.test")
	pair, err := tls.X509KeyPair([]byte(chain), []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "private origin") }))
	origin.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	origin.StartTLS()
	t.Cleanup(origin.Close)
	caFile := filepath.Join(t.TempDir(), "cells-ca.pem")
	if err := os.WriteFile(caFile, cells.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	withCA := func(name string, ca []byte) domain.Domain {
		d := tlsDomain(name, origin.URL, "origin.test", nil)
		d.Origins[0].CA = string(ca)
		return d
	}
	doms := []domain.Domain{
		withCA("own.test", private.PEM),
		withCA("own-too.test", private.PEM), // the same bundle: one location
		tlsDomain("cells.test", origin.URL, "origin.test", nil),
		withCA("other.test", other.PEM),
	}
	h := newHarness(t, harnessOpts{slots: 1, domains: doms, caFile: caFile})
	port := h.waitReady("cell-01", 0).HTTPPort
	for host, want := range map[string]int{"own.test": 200, "own-too.test": 200, "cells.test": 502, "other.test": 502} {
		if code, body, err := getHost(port, host, "/"); err != nil || code != want {
			t.Errorf("%s: %d %q %v, want %d", host, code, body, err, want)
		}
	}
	st := cellStatus(t, privateClient(t, h, "cell-01", nil))
	for _, k := range []string{"cells.test/app", "other.test/app"} {
		if o := st.Origins[k]; o.Failures != 1 {
			t.Errorf("%s: failures %+v, want 1", k, o)
		}
	}
	conf, err := os.ReadFile(h.slotSpec("cell-01").ConfPath())
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(conf), "location @origin_ca_"); n != 2 {
		t.Errorf("%d CA bundle locations in nginx.conf, want 2 (one a bundle)", n)
	}
}

func tlsDomain(name, url, sni string, verify *bool) domain.Domain {
	return domain.Domain{Domain: name, Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{name},
		Origins: []domain.Origin{{Name: "app", URL: url, SNI: sni, TLSVerify: verify}},
		Routes:  []domain.Route{{Prefix: "/", Origin: "app"}}}
}

// An origin of two servers, one of them gone: requests keep succeeding
// (a failed one is tried again on the other), the gone one is marked down
// in the cell's status, and is used again once it is back.
func TestOriginServerDownIsSkipped(t *testing.T) {
	a, _ := countingOrigin(t)
	// b: a port where nothing listens yet.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bAddr := ln.Addr().String()
	ln.Close()
	doms := originDomain("")
	doms[0].Origins[0] = domain.Origin{Name: "app", Servers: []domain.OriginServer{{URL: a.URL}, {URL: "http://" + bAddr, Weight: 3}}}
	h := newHarness(t, harnessOpts{slots: 1, domains: doms})
	port := h.waitReady("cell-01", 0).HTTPPort
	for i := 0; i < 40; i++ {
		if code, body, err := get(port, "/x"); err != nil || code != 200 || !strings.HasPrefix(body, "origin ") {
			t.Fatalf("request %d with a server gone: %d %q %v", i, code, body, err)
		}
	}
	api := privateClient(t, h, "cell-01", nil)
	key := testHost + "/app http://" + bAddr
	st := cellStatus(t, api)
	if s := st.OriginServers[key]; s.Up || s.Failures < 3 {
		t.Errorf("the gone server %+v: want down after its failures", s)
	}
	if s := st.OriginServers[testHost+"/app "+a.URL]; !s.Up || s.Retries == 0 {
		t.Errorf("the live server %+v: want up, with the retries it took", s)
	}
	// Back: used again once its down time (10 s) is over.
	listenOn(t, bAddr, "b is back")
	testutil.Eventually(t, 30*time.Second, func() error {
		if _, body, err := get(port, "/x"); err != nil || body != "b is back" {
			return fmt.Errorf("%q %v", body, err)
		}
		return nil
	})
}

// A resolver that never answers holds a request for its timeout (a
// second), not longer: the request is answered 502, counted with the
// reason, and the cell keeps serving its other routes meanwhile.
func TestOriginResolverThatHangs(t *testing.T) {
	silent, err := net.ListenPacket("udp", "127.0.0.1:0") // reads nothing, answers nothing
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	h := newHarness(t, harnessOpts{slots: 1, domains: originDomain("http://app.origin.test:9"), resolvers: []string{silent.LocalAddr().String()}})
	port := h.waitReady("cell-01", 0).HTTPPort
	done := make(chan error, 1)
	go func() {
		code, _, err := get(port, "/")
		if err == nil && code != 502 {
			err = fmt.Errorf("answered %d, want 502", code)
		}
		done <- err
	}()
	if code, body, err := get(port, "/static"); err != nil || code != 200 || body != "static" {
		t.Errorf("while a lookup hangs, a respond route: %d %q %v", code, body, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a request to an origin whose resolver hangs was not answered in 20s")
	}
	api := privateClient(t, h, "cell-01", nil)
	if o := cellStatus(t, api).Origins[testHost+"/app"]; o.Failures != 1 || !strings.Contains(o.LastReason, "resolve: ") || !strings.Contains(o.LastReason, "timeout") {
		t.Errorf("the failure recorded %+v, want one, resolve with the timeout", o)
	}
}

// An origin's active health check takes a server out before any request
// fails on it (its /healthz answers 503 while it serves everything else),
// and back once the check passes; status counts the checks.
func TestOriginActiveHealthCheck(t *testing.T) {
	a, _ := countingOrigin(t)
	var sick atomic.Bool
	sick.Store(true)
	var bHits atomic.Int64
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			if r.Header.Get("User-Agent") != "cellvisor-health-check" || r.Host != testHost {
				t.Errorf("check: Host %q, User-Agent %q", r.Host, r.Header.Get("User-Agent"))
			}
			if sick.Load() {
				w.WriteHeader(503)
			}
			return
		}
		bHits.Add(1)
		io.WriteString(w, "b")
	}))
	t.Cleanup(b.Close)
	doms := originDomain("")
	doms[0].Origins[0] = domain.Origin{Name: "app", Servers: []domain.OriginServer{{URL: a.URL}, {URL: b.URL, Weight: 3}},
		HealthCheck: &domain.HealthCheck{Path: "/healthz", IntervalSeconds: 2}}
	h := newHarness(t, harnessOpts{slots: 1, domains: doms})
	port := h.waitReady("cell-01", 0).HTTPPort
	api := privateClient(t, h, "cell-01", nil)
	key := testHost + "/app " + b.URL
	testutil.Eventually(t, 20*time.Second, func() error {
		if s := cellStatus(t, api).OriginServers[key]; s.Up || s.CheckFailures == 0 || !strings.Contains(s.LastCheckError, "503") {
			return fmt.Errorf("the sick server: %+v", s)
		}
		return nil
	})
	for i := 0; i < 20; i++ {
		if code, body, err := get(port, "/x"); err != nil || code != 200 || !strings.HasPrefix(body, "origin ") {
			t.Fatalf("request %d: %d %q %v", i, code, body, err)
		}
	}
	if n := bHits.Load(); n != 0 {
		t.Errorf("the server whose check fails got %d requests", n)
	}
	sick.Store(false)
	testutil.Eventually(t, 20*time.Second, func() error {
		if s := cellStatus(t, api).OriginServers[key]; !s.Up || s.LastCheckError != "" {
			return fmt.Errorf("the recovered server: %+v", s)
		}
		if _, body, err := get(port, "/x"); err != nil || body != "b" {
			return fmt.Errorf("%q %v", body, err)
		}
		return nil
	})
}

// A server that takes the check's connection and never answers fails the
// check at its timeout and is skipped; the cell is not held by it.
func TestOriginActiveHealthCheckThatHangs(t *testing.T) {
	a, _ := countingOrigin(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	conns := make(chan net.Conn, 64)
	t.Cleanup(func() {
		ln.Close()
		held.Wait()
		close(conns)
		for c := range conns {
			c.Close()
		}
	})
	held.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case conns <- c: // held open, never answered
			default:
				c.Close()
			}
		}
	})
	hung := "http://" + ln.Addr().String()
	doms := originDomain("")
	doms[0].Origins[0] = domain.Origin{Name: "app", Servers: []domain.OriginServer{{URL: a.URL}, {URL: hung}},
		HealthCheck: &domain.HealthCheck{Path: "/healthz", IntervalSeconds: 2, TimeoutMs: 200}}
	h := newHarness(t, harnessOpts{slots: 1, domains: doms})
	port := h.waitReady("cell-01", 0).HTTPPort
	api := privateClient(t, h, "cell-01", nil)
	testutil.Eventually(t, 20*time.Second, func() error {
		if s := cellStatus(t, api).OriginServers[testHost+"/app "+hung]; s.Up || s.CheckFailures == 0 || !strings.Contains(s.LastCheckError, "timeout") {
			return fmt.Errorf("the hung server: %+v", s)
		}
		return nil
	})
	for i := 0; i < 10; i++ {
		if code, body, err := get(port, "/x"); err != nil || code != 200 || !strings.HasPrefix(body, "origin ") {
			t.Fatalf("request %d with a hung server: %d %q %v", i, code, body, err)
		}
	}
}
