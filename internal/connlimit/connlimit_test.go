package connlimit

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"cellvisor/testkit/testutil"
)

// pki is a CA, a server certificate for 127.0.0.1 and a client one.
type pki struct {
	roots  *x509.CertPool
	server tls.Certificate
	client tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, tmpl *x509.Certificate) tls.Certificate {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = big.NewInt(serial), time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	p := &pki{roots: x509.NewCertPool()}
	p.roots.AddCert(ca)
	p.server = issue(2, &x509.Certificate{Subject: pkix.Name{CommonName: "server"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	p.client = issue(3, &x509.Certificate{Subject: pkix.Name{CommonName: "peer"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return p
}

func (p *pki) serverConfig(auth tls.ClientAuthType) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.server}, ClientAuth: auth, ClientCAs: p.roots,
		NextProtos: []string{"http/1.1"}}
}

func (p *pki) clientConfig(withCert bool) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.roots, ServerName: "127.0.0.1"}
	if withCert {
		c.Certificates = []tls.Certificate{p.client}
	}
	return c
}

// serve runs an HTTP server answering "ok" on a bounded listener on
// 127.0.0.1, until the test ends.
func serve(t *testing.T, o Options) *Listener {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.Logger = zaptest.NewLogger(t)
	ln, err := New(inner, o)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, ConnState: ln.ConnState, TLSConfig: o.TLS,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return ln
}

// dial opens a connection from source (127.0.0.x) that the test closes.
func dial(t *testing.T, ctx context.Context, source, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", source, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get makes one request over a new mutual-TLS connection from source.
func get(ctx context.Context, source, addr string, cfg *tls.Config) error {
	d := &tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}, Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "ok" {
		return fmt.Errorf("answer %d %q", resp.StatusCode, body)
	}
	return nil
}

// A flood of connections that never send a ClientHello, from eight
// addresses, far over the caps and held open: the listener never holds
// more than its caps, its goroutines stay bounded, and peers with a
// certificate get through, from a quiet address and from a flooding one.
func TestFloodDoesNotLockOutPeers(t *testing.T) {
	const (
		n        = 2000
		maxConns = 40
		perIP    = 4 // eight addresses: 32 pending, under MaxPending
	)
	p := newPKI(t)
	ln := serve(t, Options{Name: "test", Max: maxConns, MaxPerIP: perIP, HandshakeTimeout: time.Minute,
		TLS: p.serverConfig(tls.RequireAndVerifyClientCert)})
	addr := ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runtime.GC()
	g0 := runtime.NumGoroutine()
	peak := 0
	for i := range n {
		dial(t, ctx, fmt.Sprintf("127.0.0.%d", 2+i%8), addr)
		if i%100 == 99 {
			st := ln.Stats()
			peak = max(peak, st.Open)
		}
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if st := ln.Stats(); st.Accepted < n {
			return fmt.Errorf("%d of %d taken", st.Accepted, n)
		}
		return nil
	})
	for _, src := range []string{"127.0.0.1", "127.0.0.2"} {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		if err := get(rctx, src, addr, p.clientConfig(true)); err != nil {
			t.Errorf("a peer from %s during the flood: %v", src, err)
		}
		rcancel()
	}
	g1 := runtime.NumGoroutine()
	st := ln.Stats()
	t.Logf("stats after a flood of %d: %+v; goroutines %d -> %d", n, st, g0, g1)
	if peak > maxConns || st.Open > maxConns || st.Pending > 8*perIP {
		t.Errorf("open %d (peak %d), pending %d: over the caps %d and %d per address", st.Open, peak, st.Pending, maxConns, perIP)
	}
	if d := g1 - g0; d > maxConns+10 {
		t.Errorf("goroutines grew by %d: want at most the cap %d and a few", d, maxConns)
	}
	if st.DroppedPerIP < n-8*perIP || st.RefusedFull+st.RefusedPerIP != 0 {
		t.Errorf("want the flood dropped oldest first per address (at least %d dropped) and nothing refused: %+v", n-8*perIP, st)
	}
}

// At its caps with every connection established, the listener refuses the
// new one: per address first, then in all.
func TestRefusesWhenEveryConnectionIsEstablished(t *testing.T) {
	p := newPKI(t)
	ln := serve(t, Options{Name: "test", Max: 3, MaxPerIP: 2, HandshakeTimeout: time.Minute, TLS: p.serverConfig(tls.RequireAndVerifyClientCert)})
	addr := ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	established := func(src string) *tls.Conn {
		c := tls.Client(dial(t, ctx, src, addr), p.clientConfig(true))
		if err := c.HandshakeContext(ctx); err != nil {
			t.Fatalf("handshake from %s: %v", src, err)
		}
		return c
	}
	established("127.0.0.2")
	established("127.0.0.2")
	testutil.Eventually(t, 10*time.Second, func() error {
		if st := ln.Stats(); st.Open != 2 || st.Pending != 0 {
			return fmt.Errorf("stats %+v: want 2 established", st)
		}
		return nil
	})
	refused := func(src string, counter func(Stats) uint64) {
		t.Helper()
		c := tls.Client(dial(t, ctx, src, addr), p.clientConfig(true))
		c.SetDeadline(time.Now().Add(10 * time.Second))
		// A TLS 1.3 client finishes its side before the server reads its
		// certificate: the refusal shows at the first read.
		err := c.HandshakeContext(ctx)
		if err == nil {
			_, err = c.Read(make([]byte, 1))
		}
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("a connection from %s over the cap: %v, want it closed at once", src, err)
		}
		testutil.Eventually(t, 10*time.Second, func() error {
			if counter(ln.Stats()) != 1 {
				return fmt.Errorf("stats %+v", ln.Stats())
			}
			return nil
		})
	}
	refused("127.0.0.2", func(s Stats) uint64 { return s.RefusedPerIP })
	established("127.0.0.3")
	// A TLS 1.3 client is through before the server has checked its
	// certificate: await the server's side.
	testutil.Eventually(t, 10*time.Second, func() error {
		if st := ln.Stats(); st.Open != 3 || st.Pending != 0 {
			return fmt.Errorf("stats %+v: want 3 established", st)
		}
		return nil
	})
	refused("127.0.0.4", func(s Stats) uint64 { return s.RefusedFull })
}

// A connection through its TLS handshake without a client certificate (an
// enrollment) is served but stays droppable: at the cap it makes room for
// a new one; a connection with a certificate does not.
func TestWithoutCertificateStaysDroppable(t *testing.T) {
	p := newPKI(t)
	ln := serve(t, Options{Name: "test", Max: 2, HandshakeTimeout: time.Minute, TLS: p.serverConfig(tls.VerifyClientCertIfGiven)})
	addr := ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	anon := tls.Client(dial(t, ctx, "127.0.0.2", addr), p.clientConfig(false))
	if err := anon.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	peer := tls.Client(dial(t, ctx, "127.0.0.3", addr), p.clientConfig(true))
	if err := peer.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if st := ln.Stats(); st.Open != 2 || st.Pending != 1 {
			return fmt.Errorf("stats %+v: want 2 open, the one without a certificate pending", st)
		}
		return nil
	})
	if err := get(ctx, "127.0.0.4", addr, p.clientConfig(true)); err != nil {
		t.Fatalf("a peer at the cap: %v", err)
	}
	anon.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := anon.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the connection without a certificate: read %v, want it dropped", err)
	}
	if st := ln.Stats(); st.DroppedFull != 1 {
		t.Fatalf("stats %+v: want one dropped at the cap", st)
	}
}

// On a plain listener a connection is established by its first request:
// one that sends nothing is closed at the handshake deadline, one that
// made a request stays open past it (keep-alive).
func TestPlainHandshakeDeadline(t *testing.T) {
	ln := serve(t, Options{Name: "test", Max: 4, HandshakeTimeout: 200 * time.Millisecond})
	addr := ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	silent := dial(t, ctx, "127.0.0.2", addr)
	talker := dial(t, ctx, "127.0.0.3", addr)
	br := bufio.NewReader(talker)
	fmt.Fprintf(talker, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	silent.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a connection that sent nothing: read %v, want EOF at the deadline", err)
	}
	if st := ln.Stats(); st.HandshakeTimeouts != 1 || st.Open != 1 || st.Pending != 0 {
		t.Fatalf("stats %+v: want one timed out, the requester open and established", st)
	}
	// Past the deadline the requester is still served on its connection.
	fmt.Fprintf(talker, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	talker.SetDeadline(time.Now().Add(10 * time.Second))
	if resp, err = http.ReadResponse(br, nil); err != nil {
		t.Fatalf("second request on the established connection: %v", err)
	}
	resp.Body.Close()
}
