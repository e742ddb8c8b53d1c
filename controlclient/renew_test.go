package controlclient

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/edgeapi"
)

// The renewal times of 1,000 agents enrolled at the same moment spread
// uniformly over [70 %, 90 %] of the lifetime.
func TestRenewAtSpreadsAFleet(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	life := 365 * 24 * time.Hour
	na := nb.Add(life)
	rng := mrand.New(mrand.NewPCG(1, 2))
	const n = 1000
	var deciles [10]int
	var sum, sumSq float64
	for range n {
		f := float64(RenewAt(nb, na, rng.Float64()).Sub(nb)) / float64(life)
		if f < 0.7 || f > 0.9 {
			t.Fatalf("renewal at %.4f of the lifetime, want within [0.7, 0.9]", f)
		}
		deciles[min(int((f-0.7)/0.02), 9)]++
		sum += f
		sumSq += f * f
	}
	for i, c := range deciles {
		if c == 0 {
			t.Errorf("decile %d of [70 %%, 90 %%] is empty: %v", i, deciles)
		}
	}
	mean := sum / n
	sd := math.Sqrt(sumSq/n - mean*mean)
	uniform := 0.2 / math.Sqrt(12) // a uniform's over a range of 0.2
	if math.Abs(mean-0.8) > 0.01 || math.Abs(sd-uniform)/uniform > 0.1 {
		t.Errorf("mean %.4f (want 0.8), standard deviation %.4f (want %.4f ±10 %%)", mean, sd, uniform)
	}
	t.Logf("deciles %v, mean %.4f, standard deviation %.4f (uniform %.4f)", deciles, mean, sd, uniform)
	// The ends of the draw.
	if got := RenewAt(nb, na, 0); !got.Equal(nb.Add(life * 7 / 10)) {
		t.Errorf("r = 0: %v", got)
	}
	if got := RenewAt(nb, na, math.Nextafter(1, 0)); got.After(nb.Add(life*9/10)) || got.Before(nb.Add(life*9/10-time.Second)) {
		t.Errorf("r → 1: %v", got)
	}
}

func TestRetryDelayDoublesCapsAndJitters(t *testing.T) {
	lo, hi := 10*time.Second, 5*time.Minute
	for _, tc := range []struct {
		n    int
		r    float64
		want time.Duration
	}{
		{0, 0.5, 10 * time.Second},
		{0, 0, 5 * time.Second},
		{0, 0.999999, 15 * time.Second},
		{1, 0.5, 20 * time.Second},
		{4, 0.5, 160 * time.Second},
		{5, 0.5, 5 * time.Minute},
		{60, 0.5, 5 * time.Minute}, // no overflow
		{60, 0, 150 * time.Second},
	} {
		got := retryDelay(tc.n, lo, hi, tc.r)
		if d := got - tc.want; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("retryDelay(%d, r=%v) = %v, want %v", tc.n, tc.r, got, tc.want)
		}
	}
}

// testCA is a CA for identity files.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

var serials = struct {
	sync.Mutex
	n int64
}{n: 100}

// issue issues a certificate for pub: a client one for CN, or a server
// one for 127.0.0.1 when cn is empty.
func (ca *testCA) issue(t *testing.T, pub crypto.PublicKey, cn string, notBefore, notAfter time.Time) string {
	t.Helper()
	serials.Lock()
	serials.n++
	sn := serials.n
	serials.Unlock()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(sn), Subject: pkix.Name{CommonName: cn}, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if cn == "" {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func keyPEM(t *testing.T, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func write(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, dir, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

const edgeID = "3f1b3c1e-0000-4000-8000-000000000001"

// identity writes an identity directory: pair A current, pair B renewed
// (its key, a CSR and its certificate), as a renewal leaves them before
// its switch.
func identity(t *testing.T, ca *testCA) (dir string, a, b [2]string) {
	t.Helper()
	dir = t.TempDir()
	now := time.Now()
	ka, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	kb, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	a = [2]string{string(keyPEM(t, ka)), ca.issue(t, &ka.PublicKey, edgeID, now.Add(-time.Hour), now.Add(time.Hour))}
	b = [2]string{string(keyPEM(t, kb)), ca.issue(t, &kb.PublicKey, edgeID, now.Add(-time.Minute), now.Add(2*time.Hour))}
	write(t, dir, KeyFile, []byte(a[0]))
	write(t, dir, CertFile, []byte(a[1]))
	write(t, dir, ServerCAFile, []byte(ca.pem))
	write(t, dir, renewKey, []byte(b[0]))
	write(t, dir, renewCSR, []byte("csr"))
	write(t, dir, renewCert, []byte(b[1]))
	return dir, a, b
}

func renewalLeft(t *testing.T, dir string) []string {
	left, _ := filepath.Glob(filepath.Join(dir, "renew-*"))
	return left
}

// A crash at any point of a switch leaves a usable pair, and the next
// start finishes the switch.
func TestSwitchSurvivesACrashAtEveryStep(t *testing.T) {
	ca := newTestCA(t)
	for _, tc := range []struct {
		name  string
		crash func(t *testing.T, dir string, a, b [2]string)
		want  int // 0: pair A stays, 1: pair B is switched to
	}{
		{"certificate kept, nothing switched", func(*testing.T, string, [2]string, [2]string) {}, 1},
		{"key switched, certificate not", func(t *testing.T, dir string, a, b [2]string) { write(t, dir, KeyFile, []byte(b[0])) }, 1},
		{"both switched, renewal files left", func(t *testing.T, dir string, a, b [2]string) {
			write(t, dir, KeyFile, []byte(b[0]))
			write(t, dir, CertFile, []byte(b[1]))
		}, 1},
		{"renewal key removed, certificate left", func(t *testing.T, dir string, a, b [2]string) {
			write(t, dir, KeyFile, []byte(b[0]))
			write(t, dir, CertFile, []byte(b[1]))
			os.Remove(filepath.Join(dir, renewKey))
		}, 1},
		{"renewed certificate damaged", func(t *testing.T, dir string, a, b [2]string) { write(t, dir, renewCert, []byte(b[1][:100])) }, 0},
		{"renewed certificate older than the one in use", func(t *testing.T, dir string, a, b [2]string) {
			// pair A was enrolled again after B was issued: swap their roles.
			write(t, dir, KeyFile, []byte(b[0]))
			write(t, dir, CertFile, []byte(b[1]))
			write(t, dir, renewKey, []byte(a[0]))
			write(t, dir, renewCert, []byte(a[1]))
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, a, b := identity(t, ca)
			tc.crash(t, dir, a, b)
			c, err := New(Options{URL: "https://127.0.0.1:1", Dir: dir})
			if err != nil {
				t.Fatalf("start after the crash: %v", err)
			}
			if err := c.finishSwitch(c.log); err != nil {
				t.Fatal(err)
			}
			want := [][2]string{a, b}[tc.want]
			if read(t, dir, KeyFile) != want[0] || read(t, dir, CertFile) != want[1] {
				t.Fatalf("identity files are not pair %c", "AB"[tc.want])
			}
			if _, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)); err != nil {
				t.Fatal(err)
			}
			cert, err := c.clientCert(nil)
			if err != nil || string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})) != want[1] {
				t.Fatalf("certificate in use is not the file's: %v", err)
			}
			if tc.name == "renewed certificate damaged" {
				// The key and CSR stay for an exact retry.
				if left := renewalLeft(t, dir); len(left) != 2 {
					t.Fatalf("renewal files %v, want the key and CSR", left)
				}
			} else if left := renewalLeft(t, dir); len(left) != 0 {
				t.Fatalf("renewal files left: %v", left)
			}
		})
	}
}

// A renewal whose answer is lost is retried with the same CSR, and the
// client switches to what the retry got; mutual TLS throughout, against a
// fake control plane that requires client certificates.
func TestRenewalAnswerLostThenRetried(t *testing.T) {
	ca := newTestCA(t)
	dir, _, _ := identity(t, ca)
	for _, f := range []string{renewKey, renewCSR, renewCert} {
		os.Remove(filepath.Join(dir, f))
	}
	var mu sync.Mutex
	var csrs []string
	var presented []string // serials of the client certificates seen
	url := ca.control(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		presented = append(presented, r.TLS.PeerCertificates[0].SerialNumber.String())
		switch r.URL.Path {
		case edgeapi.PathRenew:
			var req edgeapi.RenewRequest
			json.NewDecoder(r.Body).Decode(&req)
			csrs = append(csrs, req.CSR)
			if len(csrs) == 1 {
				http.Error(w, `{"error":"lost"}`, http.StatusBadGateway)
				return
			}
			b, _ := pem.Decode([]byte(req.CSR))
			csr, err := x509.ParseCertificateRequest(b.Bytes)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			json.NewEncoder(w).Encode(edgeapi.RenewResponse{Certificate: ca.issue(t, csr.PublicKey, edgeID, time.Now().Add(-time.Minute), time.Now().Add(3*time.Hour)), CA: ca.pem})
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))

	c, err := New(Options{URL: url, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdle)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := c.leaf()
	if _, err := c.renew(ctx, edgeID); err == nil {
		t.Fatal("renewal through a lost answer succeeded")
	}
	if st, err := os.Stat(filepath.Join(dir, renewKey)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("pending renewal key: %v, %v", st, err)
	}
	if read(t, dir, CertFile) != string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: before.Raw})) {
		t.Fatal("a failed renewal changed the certificate file")
	}
	serial, err := c.renew(ctx, edgeID)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if len(csrs) != 2 || csrs[0] != csrs[1] {
		t.Fatalf("the retry sent another CSR")
	}
	after := c.leaf()
	if after.SerialNumber.Text(16) != serial || after.NotAfter.Equal(before.NotAfter) {
		t.Fatalf("in use after the switch: serial %s, want %s", after.SerialNumber.Text(16), serial)
	}
	if left := renewalLeft(t, dir); len(left) != 0 {
		t.Fatalf("renewal files left: %v", left)
	}
	if st := c.Renewal(); !st.CertExpires.Equal(after.NotAfter) || st.LastRenewed.IsZero() {
		t.Fatalf("renewal status %+v", st)
	}
	// The next request presents the renewed certificate.
	if err := c.Report(ctx, edgeapi.StatusReport{At: time.Now(), Status: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := presented[len(presented)-1]; got != after.SerialNumber.String() {
		t.Fatalf("the request after the switch presented serial %s, want %s", got, after.SerialNumber.String())
	}
}

// control serves h as a fake control plane over TLS that requires client
// certificates issued by ca, and returns its URL.
func (ca *testCA) control(t *testing.T, h http.Handler) string {
	t.Helper()
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvCert, err := tls.X509KeyPair([]byte(ca.issue(t, &srvKey.PublicKey, "", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))), keyPEM(t, srvKey))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

// An agent whose certificate expired (switched off for most of its
// lifetime) tries at once, keeps retrying, and says what to do.
func TestExpiredCertificateSaysRotate(t *testing.T) {
	ca := newTestCA(t)
	dir, _, _ := identity(t, ca)
	for _, f := range []string{renewKey, renewCSR, renewCert} {
		os.Remove(filepath.Join(dir, f))
	}
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	write(t, dir, KeyFile, keyPEM(t, k))
	write(t, dir, CertFile, []byte(ca.issue(t, &k.PublicKey, edgeID, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))))
	url := ca.control(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a request with an expired certificate got through: %s", r.URL.Path)
	}))
	c, err := New(Options{URL: url, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdle)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.RunRenewal(ctx, RenewOptions{RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-done })
	var st RenewalStatus
	for st = c.Renewal(); st.LastError == "" && ctx.Err() == nil; st = c.Renewal() {
		// Await the first failed attempt: nothing to be woken by.
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
	if !strings.Contains(st.LastError, "expired at") || !strings.Contains(st.LastError, "edge rotate") {
		t.Fatalf("renewal error %q, want it to say the certificate expired and to rotate", st.LastError)
	}
	if st.Next.IsZero() || st.CertExpires.After(time.Now()) {
		t.Fatalf("status %+v", st)
	}
}
