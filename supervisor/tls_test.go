package supervisor_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/internal/testcert"
)

// tlsDomains are three domains of shared-default: secure.test with its
// certificate (redirect to https, HSTS, an ACME challenge pending),
// *.wild.test with a wildcard one, and plain.test with none.
func tlsDomains(t *testing.T, ca *testcert.CA, rev int64) ([]domain.Domain, map[string][]byte) {
	t.Helper()
	keys := map[string][]byte{}
	withCert := func(d domain.Domain, names ...string) domain.Domain {
		chain, key := ca.Issue(t, time.Time{}, names...)
		fp, err := domain.ChainFingerprint(chain)
		if err != nil {
			t.Fatal(err)
		}
		if d.TLS == nil {
			d.TLS = &domain.TLS{}
		}
		d.TLS.Certificate, d.TLS.Chain, d.TLS.Fingerprint = "c-"+strings.ReplaceAll(d.Domain, ".", "-"), chain, fp
		keys[d.Domain] = []byte(key)
		return d
	}
	body := "rev " + strconv.FormatInt(rev, 10)
	route := []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: body}}}
	secure := withCert(domain.Domain{Domain: "secure.test", Pool: domain.PoolSharedDefault, Revision: rev,
		Hostnames: []string{"secure.test", "www.secure.test"}, Routes: route,
		TLS: &domain.TLS{RedirectHTTP: true, HSTS: &domain.HSTS{MaxAgeSeconds: 600, IncludeSubdomains: true},
			Challenges: []domain.ACMEChallenge{{Token: "tok-1", KeyAuthorization: "tok-1.thumb"}}}},
		"secure.test", "www.secure.test")
	wild := withCert(domain.Domain{Domain: "wild.test", Pool: domain.PoolSharedDefault, Revision: rev,
		Hostnames: []string{"*.wild.test"}, Routes: route}, "*.wild.test")
	plain := domain.Domain{Domain: "plain.test", Pool: domain.PoolSharedDefault, Revision: rev,
		Hostnames: []string{"plain.test"}, Routes: route}
	ds := []domain.Domain{secure, wild, plain}
	for i := range ds { // through the decoder, as an artifact would be
		b, err := json.Marshal(ds[i])
		if err != nil {
			t.Fatal(err)
		}
		if ds[i], err = domain.Decode(b); err != nil {
			t.Fatal(err)
		}
	}
	return ds, keys
}

// handshake connects to the cell's HTTPS port with sni and answers the
// connection state, or the handshake's error.
func handshake(port int, sni string, cfg *tls.Config) (tls.ConnectionState, error) {
	c := cfg.Clone()
	c.ServerName = sni
	d := tls.Dialer{Config: c, NetDialer: &net.Dialer{Timeout: 5 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState(), nil
}

// A cell presents each domain's certificate by SNI (a wildcard by the
// one-label rule), refuses unknown names, no name and TLS 1.1, speaks
// HTTP/2, resumes sessions, redirects plain HTTP where the domain asks,
// adds HSTS, and answers a pending ACME challenge on the HTTP port.
func TestCellServesHTTPSBySNI(t *testing.T) {
	ca := testcert.NewCA(t)
	ds, keys := tlsDomains(t, ca, 1)
	h := newHarness(t, harnessOpts{slots: 1, domains: ds, keys: keys})
	st := h.waitReady("cell-01", 0)
	base := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}

	for sni, want := range map[string]string{"secure.test": "secure.test", "WWW.Secure.Test": "secure.test", "a.wild.test": "*.wild.test"} {
		cs, err := handshake(st.HTTPSPort, sni, base)
		if err != nil {
			t.Fatalf("handshake for %s: %v", sni, err)
		}
		if got := cs.PeerCertificates[0].DNSNames[0]; got != want {
			t.Errorf("SNI %s: presented %s, want %s", sni, got, want)
		}
	}
	for _, sni := range []string{"plain.test", "unknown.test", "a.b.wild.test", "wild.test"} {
		if _, err := handshake(st.HTTPSPort, sni, &tls.Config{InsecureSkipVerify: true}); err == nil {
			t.Errorf("SNI %s: handshake accepted, want refused", sni)
		}
	}
	// No SNI at all (an IP address as the server name sends none).
	if _, err := handshake(st.HTTPSPort, "", &tls.Config{InsecureSkipVerify: true}); err == nil {
		t.Error("a handshake without SNI was accepted")
	}
	old := base.Clone()
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if _, err := handshake(st.HTTPSPort, "secure.test", old); err == nil {
		t.Error("TLS 1.1 was accepted")
	}

	// HTTP/2 over TLS, with HSTS; a resumed session.
	cache := tls.NewLRUClientSessionCache(4)
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: ca.Pool(), ClientSessionCache: cache},
		ForceAttemptHTTP2: true, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(st.HTTPSPort))
		},
	}, Timeout: 10 * time.Second}
	resumed := 0
	for i := 0; i < 2; i++ {
		resp, err := client.Get("https://secure.test/x")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "rev 1" || resp.ProtoMajor != 2 {
			t.Fatalf("https://secure.test/x: %s %s %q", resp.Proto, resp.Status, b)
		}
		if got := resp.Header.Get("Strict-Transport-Security"); got != "max-age=600; includeSubDomains" {
			t.Errorf("HSTS: %q", got)
		}
		if resp.TLS.DidResume {
			resumed++
		}
	}
	if resumed != 1 {
		t.Errorf("%d of 2 connections resumed, want the second", resumed)
	}

	// Plain HTTP: redirected where the domain asks (not the challenge),
	// served where it does not.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 10 * time.Second}
	get := func(host, path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(st.HTTPPort)+path, nil)
		req.Host = host
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := get("secure.test", "/a/b?c=d")
	resp.Body.Close()
	if resp.StatusCode != 301 || resp.Header.Get("Location") != "https://secure.test/a/b?c=d" {
		t.Errorf("http://secure.test/a/b?c=d: %s to %q, want 301 to https://secure.test/a/b?c=d", resp.Status, resp.Header.Get("Location"))
	}
	if resp.Header.Get("Strict-Transport-Security") != "" {
		t.Error("HSTS sent over plain HTTP")
	}
	resp = get("secure.test", "/.well-known/acme-challenge/tok-1")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "tok-1.thumb" {
		t.Errorf("ACME challenge: %s %q", resp.Status, b)
	}
	resp = get("plain.test", "/")
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("http://plain.test/: %s", resp.Status)
	}

	// Status says what the cell presents, with each certificate's expiry,
	// and counts the refused handshakes by reason.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	live := h.sup.LiveStatus(ctx).Slots[0].Cell
	if live == nil {
		t.Fatal("no live status of cell-01")
	}
	if got := live.TLS.Certificates; len(got) != 2 || got["secure.test"].Fingerprint != ds[0].TLS.Fingerprint ||
		time.Until(time.Unix(got["wild.test"].NotAfter, 0)) < 23*time.Hour {
		t.Errorf("status certificates: %+v", got)
	}
	if live.TLS.UnknownName != 4 || live.TLS.NoName != 1 {
		t.Errorf("refused handshakes: %d unknown name, %d no name; want 4 and 1", live.TLS.UnknownName, live.TLS.NoName)
	}

	// And as openssl s_client sees it.
	if _, err := exec.LookPath("openssl"); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "openssl", "s_client", "-connect", "127.0.0.1:"+strconv.Itoa(st.HTTPSPort),
			"-servername", "secure.test", "-tls1_3", "-brief").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Protocol version: TLSv1.3") || !strings.Contains(string(out), "secure.test") {
			t.Errorf("openssl s_client: %v\n%s", err, out)
		}
	}
}

// A new certificate reaches a serving cell without a reload: every
// handshake during the swap succeeds, and each presents either the old
// certificate or the new one, the new one once the load is answered.
func TestCertificateSwapWithoutFailedHandshakes(t *testing.T) {
	ca := testcert.NewCA(t)
	ds, keys := tlsDomains(t, ca, 1)
	h := newHarness(t, harnessOpts{slots: 1, domains: ds, keys: keys})
	st := h.waitReady("cell-01", 0)
	cfg := &tls.Config{RootCAs: ca.Pool()}
	first, err := handshake(st.HTTPSPort, "secure.test", cfg)
	if err != nil {
		t.Fatal(err)
	}
	oldSerial := first.PeerCertificates[0].SerialNumber

	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := handshake(st.HTTPSPort, "secure.test", cfg); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	// Let the load run before and after the swap.
	waitCount(t, &ok, 50)
	ds2, keys2 := tlsDomains(t, ca, 2)
	h.keys = keys2
	how := h.publish(2, ds2, nil)
	after := ok.Load()
	waitCount(t, &ok, after+50)
	close(stop)
	wg.Wait()
	if how != "loaded" {
		t.Errorf("the new certificate was %s, want loaded", how)
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d handshakes failed during the swap (first: %v)", n, n+ok.Load(), firstErr.Load())
	}
	cs, err := handshake(st.HTTPSPort, "secure.test", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cs.PeerCertificates[0].SerialNumber.Cmp(oldSerial) == 0 {
		t.Error("the old certificate is still presented after the load")
	}
	t.Logf("%d handshakes during the swap, 0 failed", ok.Load())
}

// waitCount waits until n reaches want (bounded).
func waitCount(t *testing.T, n *atomic.Int64, want int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for n.Load() < want {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %d handshakes: %d", want, n.Load())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A domain whose key does not match what the cell can parse is left out,
// and the rest are served: the cell never fails its load over one key.
func TestBadKeyRefusesOnlyItsDomain(t *testing.T) {
	ca := testcert.NewCA(t)
	ds, keys := tlsDomains(t, ca, 1)
	keys["secure.test"] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("not a key")})
	h := newHarness(t, harnessOpts{slots: 1, domains: ds, keys: keys})
	st := h.waitReady("cell-01", 0)
	if _, err := handshake(st.HTTPSPort, "secure.test", &tls.Config{RootCAs: ca.Pool()}); err == nil {
		t.Error("a domain whose key does not parse was served")
	}
	if _, err := handshake(st.HTTPSPort, "a.wild.test", &tls.Config{RootCAs: ca.Pool()}); err != nil {
		t.Errorf("another domain's handshake: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if live := h.sup.LiveStatus(ctx).Slots[0].Cell; live == nil || live.TLS.BadCertificate != 1 {
		t.Errorf("status: %+v, want one handshake refused for a bad certificate", live)
	}
}
