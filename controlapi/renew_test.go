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
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// keyCSR makes a key and a CSR for it.
func keyCSR(t *testing.T) (*ecdsa.PrivateKey, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return key, csrFor(t, key)
}

func csrFor(t *testing.T, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "ignored"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// mtls is an HTTP client of the edge-control API presenting one
// certificate, on connections of its own.
func (e *env) mtls(t *testing.T, certPEM string, key *ecdsa.PrivateKey) *http.Client {
	t.Helper()
	b, _ := pem.Decode([]byte(certPEM))
	if b == nil {
		t.Fatalf("certificate %q: not PEM", certPEM)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
	cert := tls.Certificate{Certificate: [][]byte{b.Bytes}, PrivateKey: key}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}}}}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// post sends a JSON body and returns the status, the body and the error
// message of a refusal.
func post(t *testing.T, hc *http.Client, url string, in any) (int, []byte, string) {
	t.Helper()
	body, _ := json.Marshal(in)
	resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var e struct {
		Error string `json:"error"`
	}
	json.Unmarshal(data, &e)
	return resp.StatusCode, data, e.Error
}

func (e *env) renew(t *testing.T, hc *http.Client, csrPEM string) (int, edgeapi.RenewResponse) {
	t.Helper()
	code, data, _ := post(t, hc, e.edgeURL+edgeapi.PathRenew, edgeapi.RenewRequest{CSR: csrPEM})
	var rr edgeapi.RenewResponse
	if code == http.StatusOK {
		if err := json.Unmarshal(data, &rr); err != nil {
			t.Fatal(err)
		}
	}
	return code, rr
}

// status is the answer to a request that reads the database (the tasks).
func (e *env) status(t *testing.T, hc *http.Client) int {
	t.Helper()
	resp, err := hc.Get(e.edgeURL + edgeapi.PathTasks)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// cheapPoll is the answer to a poll the cache answers.
func (e *env) cheapPoll(t *testing.T, hc *http.Client) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.edgeURL+edgeapi.PathManifest+"?after=1", nil) // an edge's first manifest is 1
	req.Header.Set("If-None-Match", `"1"`)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func leafOf(t *testing.T, certPEM string) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode([]byte(certPEM))
	if b == nil {
		t.Fatal("certificate: not PEM")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A renewed certificate is pending until the edge uses it: the current one
// keeps working until then, and is refused from then on. Retries get the
// same certificate; another CSR replaces a pending one; a rotation drops
// it.
func TestRenewalIsPendingUntilUsed(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		created := e.createEdge(t, "fra-1")
		keyA, csrA := keyCSR(t)
		code, enrolled := e.rawEnroll(t, created.Token, csrA)
		if code != http.StatusOK {
			t.Fatalf("enroll: HTTP %d", code)
		}
		a := e.mtls(t, enrolled.Certificate, keyA)
		if code := e.status(t, a); code != http.StatusOK {
			t.Fatalf("enrolled certificate: HTTP %d", code)
		}

		keyB, csrB := keyCSR(t)
		code, rb := e.renew(t, a, csrB)
		if code != http.StatusOK {
			t.Fatalf("renew: HTTP %d", code)
		}
		leafB := leafOf(t, rb.Certificate)
		if leafB.Subject.CommonName != created.Edge.ID || len(leafB.IPAddresses) != 0 || rb.CA != e.srv.CAPEM() {
			t.Fatalf("renewed certificate CN %q IPs %v", leafB.Subject.CommonName, leafB.IPAddresses)
		}
		if code, again := e.renew(t, a, csrB); code != http.StatusOK || again.Certificate != rb.Certificate {
			t.Fatalf("renewal retried: HTTP %d, same certificate %v", code, again.Certificate == rb.Certificate)
		}
		if code, _ := e.renew(t, a, csrFor(t, keyA)); code != http.StatusBadRequest {
			t.Fatalf("renewal for the current key: HTTP %d, want 400", code)
		}
		if code, _ := e.renew(t, a, "not a csr"); code != http.StatusBadRequest {
			t.Fatalf("renewal with a malformed CSR: HTTP %d, want 400", code)
		}
		// Not used yet: the current certificate still works, on either path.
		if code := e.status(t, a); code != http.StatusOK {
			t.Fatalf("current certificate while a renewal is pending: HTTP %d", code)
		}
		if code := e.cheapPoll(t, a); code != http.StatusNotModified {
			t.Fatalf("cheap poll while a renewal is pending: HTTP %d", code)
		}
		if v, err := e.admin.Edge(ctx(t), created.Edge.ID); err != nil || !v.RenewalPending || v.CertExpiresAt == nil {
			t.Fatalf("edge while a renewal is pending: %+v, %v", v, err)
		}

		b := e.mtls(t, rb.Certificate, keyB)
		if code := e.cheapPoll(t, b); code != http.StatusNotModified {
			t.Fatalf("first use of the renewed certificate: HTTP %d", code)
		}
		// Used: the old one is refused, on a fresh connection or not.
		for _, hc := range []*http.Client{a, e.mtls(t, enrolled.Certificate, keyA)} {
			if code := e.status(t, hc); code != http.StatusUnauthorized {
				t.Fatalf("replaced certificate: HTTP %d, want 401", code)
			}
			if code := e.cheapPoll(t, hc); code != http.StatusUnauthorized {
				t.Fatalf("replaced certificate, cheap poll: HTTP %d, want 401", code)
			}
			if code, _ := e.renew(t, hc, csrFor(t, keyA)); code != http.StatusUnauthorized {
				t.Fatalf("renewal with the replaced certificate: HTTP %d, want 401", code)
			}
		}
		if v, err := e.admin.Edge(ctx(t), created.Edge.ID); err != nil || v.RenewalPending || !v.CertExpiresAt.Equal(leafB.NotAfter) {
			t.Fatalf("edge after the switch: %+v, %v", v, err)
		}
		// The exact enrollment retry has nothing to give any more.
		if code, _ := e.rawEnroll(t, created.Token, csrA); code != http.StatusConflict {
			t.Fatalf("enrollment retried after a renewal: HTTP %d, want 409", code)
		}

		// Another CSR replaces a pending certificate never used.
		keyC, csrC := keyCSR(t)
		_, rc := e.renew(t, b, csrC)
		keyD, csrD := keyCSR(t)
		_, rd := e.renew(t, b, csrD)
		if rc.Certificate == "" || rd.Certificate == "" || rc.Certificate == rd.Certificate {
			t.Fatal("renewals with two CSRs did not get two certificates")
		}
		if code := e.status(t, e.mtls(t, rc.Certificate, keyC)); code != http.StatusUnauthorized {
			t.Fatalf("a replaced pending certificate: HTTP %d, want 401", code)
		}
		d := e.mtls(t, rd.Certificate, keyD)
		if code := e.status(t, d); code != http.StatusOK {
			t.Fatalf("the pending certificate: HTTP %d", code)
		}

		// A rotation drops the current certificate and a pending one.
		keyE, csrE := keyCSR(t)
		_, re := e.renew(t, d, csrE)
		if _, err := e.admin.Rotate(ctx(t), created.Edge.ID); err != nil {
			t.Fatal(err)
		}
		if code := e.status(t, e.mtls(t, re.Certificate, keyE)); code != http.StatusUnauthorized {
			t.Fatalf("pending certificate after a rotation: HTTP %d, want 401", code)
		}
		if code := e.status(t, d); code != http.StatusUnauthorized {
			t.Fatalf("current certificate after a rotation: HTTP %d, want 401", code)
		}
	})
}

// An agent polling every 100 ms across three renewals of 10-second
// certificates: every poll succeeds, and the enrolled certificate is
// refused once its successor was used.
func TestRenewalLoopKeepsEveryPollWorking(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three 10-second certificate lifetimes")
	}
	const ttl = 10 * time.Second
	e := serveOn(t, filepath.Join(t.TempDir(), "control.db"), make([]byte, 32), func(o *controlapi.Options) { o.ClientCertTTL = ttl })
	created := e.createEdge(t, "fra-1")
	c, _, dir := e.enroll(t, created.Token)
	first, err := tls.LoadX509KeyPair(filepath.Join(dir, "identity", controlclient.CertFile), filepath.Join(dir, "identity", controlclient.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if life := first.Leaf.NotAfter.Sub(first.Leaf.NotBefore); life > ttl+ttl/10+time.Second {
		t.Fatalf("enrolled certificate valid %v, want about %v", life, ttl)
	}

	rctx, stop := context.WithCancel(ctx(t))
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.RunRenewal(rctx, controlclient.RenewOptions{RetryMin: 100 * time.Millisecond, RetryMax: time.Second})
	}()
	t.Cleanup(func() { stop(); <-done })

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{first}}}}
	t.Cleanup(old.CloseIdleConnections)
	serials := map[string]bool{first.Leaf.SerialNumber.Text(16): true}
	expiries := map[int64]bool{first.Leaf.NotAfter.UnixNano(): true}
	var renewed time.Time // the last switch, as the client reports it
	renewals := 0
	polls := 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for renewals < 3 {
		select {
		case <-rctx.Done():
			t.Fatalf("after %d polls, %d renewals: %v", polls, renewals, rctx.Err())
		case <-tick.C:
		}
		polls++
		if _, err := c.Page(rctx, 1, ""); !errors.Is(err, manifest.ErrNoChange) {
			t.Fatalf("poll %d: %v", polls, err)
		}
		if polls%5 == 0 {
			if _, err := c.Tasks(rctx); err != nil {
				t.Fatalf("tasks %d: %v", polls, err)
			}
		}
		cur, err := identityPair(filepath.Join(dir, "identity"))
		if err != nil {
			t.Fatalf("identity files after poll %d: %v", polls, err)
		}
		expiries[cur.Leaf.NotAfter.UnixNano()] = true
		r := c.Renewal()
		if r.LastError != "" {
			t.Fatalf("renewal failed: %s", r.LastError)
		}
		// A switch may complete between the two reads: the files are
		// written before the pair is put in use, so they hold it when read
		// again.
		if after, err := identityPair(filepath.Join(dir, "identity")); err == nil {
			expiries[after.Leaf.NotAfter.UnixNano()] = true
		}
		if !expiries[r.CertExpires.UnixNano()] {
			// In use: the files' certificate, or the one before (a switch
			// under way).
			t.Fatalf("status says the certificate expires %v, no certificate in the files did", r.CertExpires)
		}
		if r.Next.IsZero() || r.Next.After(r.CertExpires) {
			t.Fatalf("next renewal %v, certificate expires %v", r.Next, r.CertExpires)
		}
		serials[cur.Leaf.SerialNumber.Text(16)] = true
		if r.LastRenewed.Equal(renewed) {
			continue
		}
		renewed = r.LastRenewed
		renewals++
		if renewals == 1 {
			// The switch is complete: the next request presents the new
			// certificate, and that use revokes the enrolled one, refused
			// from then on while still within its lifetime.
			if _, err := c.Page(rctx, 1, ""); !errors.Is(err, manifest.ErrNoChange) {
				t.Fatalf("poll after the switch: %v", err)
			}
			if code := e.status(t, old); code != http.StatusUnauthorized {
				t.Fatalf("the enrolled certificate after its successor was used: HTTP %d, want 401", code)
			}
		}
	}
	if len(serials) != 4 {
		t.Fatalf("%d renewals, %d certificates in the files: %v", renewals, len(serials), serials)
	}
	t.Logf("%d polls, all answered, across %d renewals", polls, renewals)
	stop()
	<-done // a switch under way finishes first
	if left, _ := filepath.Glob(filepath.Join(dir, "identity", "renew-*")); len(left) != 0 {
		t.Fatalf("renewal files left: %v", left)
	}
}

// identityPair is the pair a client loads from an identity directory: the
// key and certificate files or, while a switch has written one but not the
// other, the renewed pair it is switching to (renew-key.pem and
// renew-cert.pem), which must then be whole.
func identityPair(dir string) (tls.Certificate, error) {
	// The files change under this reader while the client switches (the
	// key, then the certificate, then the renewal pair removed), and a
	// reader cannot open them all at one instant: the key is read around
	// the certificate, and a snapshot the switch moved through is read
	// again. A pair the files do not hold at any instant fails every time.
	var err error
	for range 3 {
		var key, cert, again []byte
		key, err = os.ReadFile(filepath.Join(dir, controlclient.KeyFile))
		if err != nil {
			continue
		}
		if cert, err = os.ReadFile(filepath.Join(dir, controlclient.CertFile)); err != nil {
			continue
		}
		if again, err = os.ReadFile(filepath.Join(dir, controlclient.KeyFile)); err != nil {
			continue
		}
		if !bytes.Equal(key, again) {
			err = errors.New("the key changed while the certificate was read")
			continue
		}
		cur, cerr := tls.X509KeyPair(cert, key)
		if cerr == nil {
			return cur, nil
		}
		next, rerr := tls.LoadX509KeyPair(filepath.Join(dir, "renew-cert.pem"), filepath.Join(dir, "renew-key.pem"))
		if rerr == nil {
			return next, nil
		}
		err = fmt.Errorf("%w, and no renewed pair: %w", cerr, rerr)
	}
	return tls.Certificate{}, err
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// rawEnrollErr posts an enrollment and returns the status and refusal.
func (e *env) rawEnrollErr(t *testing.T, token, csrPEM string) (int, string) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer hc.CloseIdleConnections()
	code, _, msg := post(t, hc, e.edgeURL+edgeapi.PathEnroll, edgeapi.EnrollRequest{Token: token, CSR: csrPEM})
	return code, msg
}

func TestBootstrapTokensExpire(t *testing.T) {
	run := func(t *testing.T, dsn string) {
		clk := &clock{now: time.Now().UTC().Truncate(time.Millisecond)}
		key := make([]byte, 32)
		rand.Read(key)
		e := serveOn(t, dsn, key, func(o *controlapi.Options) { o.Now, o.Store.Now = clk.Now, clk.Now })

		created := e.createEdge(t, "fra-1")
		if want := clk.Now().Add(adminapi.DefaultTokenTTL); !created.TokenExpiresAt.Equal(want) || created.Edge.TokenExpiresAt == nil || !created.Edge.TokenExpiresAt.Equal(want) {
			t.Fatalf("token expires %v (view %v), want %v", created.TokenExpiresAt, created.Edge.TokenExpiresAt, want)
		}
		clk.add(adminapi.DefaultTokenTTL)
		code, msg := e.rawEnrollErr(t, created.Token, csr(t))
		if code != http.StatusUnauthorized || !strings.Contains(msg, "bootstrap token expired at "+created.TokenExpiresAt.Format(time.RFC3339)) || !strings.Contains(msg, "rotate") {
			t.Fatalf("expired token: HTTP %d %q", code, msg)
		}
		if v, _ := e.admin.Edge(ctx(t), created.Edge.ID); v.Enrollment != adminapi.EnrollmentPending {
			t.Fatalf("edge after an expired token: %+v", v)
		}
		// A rotation issues a fresh token with the default lifetime.
		rotated, err := e.admin.Rotate(ctx(t), created.Edge.ID)
		if err != nil || !rotated.TokenExpiresAt.Equal(clk.Now().Add(adminapi.DefaultTokenTTL)) {
			t.Fatalf("rotate: token expires %v, %v", rotated.TokenExpiresAt, err)
		}
		if code, msg := e.rawEnrollErr(t, rotated.Token, csr(t)); code != http.StatusOK {
			t.Fatalf("rotated token: HTTP %d %q", code, msg)
		}
		if again, err := e.admin.RotateWith(ctx(t), created.Edge.ID, adminapi.RotateRequest{TokenTTL: "48h"}); err != nil ||
			!again.TokenExpiresAt.Equal(clk.Now().Add(48*time.Hour)) {
			t.Fatalf("rotate with 48h: token expires %v, %v", again.TokenExpiresAt, err)
		}

		// A 2-hour token, used a minute before it expires: its exact retry
		// is answered for an hour after its use, then refused.
		short, err := e.admin.CreateEdge(ctx(t), adminapi.EdgeRequest{Name: "fra-2", Org: "acme", Country: "DE", Continent: "EU", TokenTTL: "2h"})
		if err != nil || !short.TokenExpiresAt.Equal(clk.Now().Add(2*time.Hour)) {
			t.Fatalf("create with 2h: token expires %v, %v", short.TokenExpiresAt, err)
		}
		clk.add(2*time.Hour - time.Minute)
		req := csr(t)
		code, first := e.rawEnroll(t, short.Token, req)
		if code != http.StatusOK {
			t.Fatalf("enroll a minute before expiry: HTTP %d", code)
		}
		clk.add(30 * time.Minute)
		if code, again := e.rawEnroll(t, short.Token, req); code != http.StatusOK || again.Certificate != first.Certificate {
			t.Fatalf("exact retry after expiry, within the grace: HTTP %d", code)
		}
		if code, _ := e.rawEnroll(t, short.Token, csr(t)); code != http.StatusConflict {
			t.Fatalf("another CSR after expiry: HTTP %d, want 409", code)
		}
		clk.add(controlapi.RetryGrace - 30*time.Minute)
		if code, msg := e.rawEnrollErr(t, short.Token, req); code != http.StatusUnauthorized || !strings.Contains(msg, "expired") {
			t.Fatalf("exact retry past the grace: HTTP %d %q, want 401", code, msg)
		}

		for _, ttl := range []string{"1s", "abc", "721h", "-1h"} {
			_, err := e.admin.CreateEdge(ctx(t), adminapi.EdgeRequest{Name: "fra-3", Org: "acme", Country: "DE", Continent: "EU", TokenTTL: ttl})
			var ae *adminapi.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(err.Error(), "token_ttl") {
				t.Fatalf("token_ttl %q: %v, want 400 naming token_ttl", ttl, err)
			}
			if _, err := e.admin.RotateWith(ctx(t), created.Edge.ID, adminapi.RotateRequest{TokenTTL: ttl}); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
				t.Fatalf("rotate with token_ttl %q: %v, want 400", ttl, err)
			}
		}
	}
	t.Run(store.SQLite, func(t *testing.T) { run(t, filepath.Join(t.TempDir(), "control.db")) })
	t.Run(store.Postgres, func(t *testing.T) { run(t, testutil.Postgres(t)) })
}

// The first uses of a renewed certificate arrive together (an agent's poll
// beside the encryption key it registers after the switch): one promotes
// it, and every other is answered as the edge's current identity too, not
// refused because the promotion happened between its look at the cache and
// its look at the database.
func TestRenewedCertificateFirstUsesTogether(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		created := e.createEdge(t, "fra-1")
		key, csr := keyCSR(t)
		code, enrolled := e.rawEnroll(t, created.Token, csr)
		if code != http.StatusOK {
			t.Fatalf("enroll: HTTP %d", code)
		}
		cur := e.mtls(t, enrolled.Certificate, key)
		const renewals, together = 8, 8
		for i := range renewals {
			nextKey, nextCSR := keyCSR(t)
			code, rr := e.renew(t, cur, nextCSR)
			if code != http.StatusOK {
				t.Fatalf("renewal %d: HTTP %d", i, code)
			}
			// Clients of their own: each opens its own connection, so the
			// requests reach the server together.
			var wg sync.WaitGroup
			codes := make([]int, together)
			for j := range together {
				hc := e.mtls(t, rr.Certificate, nextKey)
				wg.Go(func() {
					resp, err := hc.Get(e.edgeURL + edgeapi.PathTasks)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					codes[j] = resp.StatusCode
				})
			}
			wg.Wait()
			for j, code := range codes {
				if code != http.StatusOK {
					t.Fatalf("renewal %d: first use %d of the renewed certificate: HTTP %d (all: %v)", i, j, code, codes)
				}
			}
			cur = e.mtls(t, rr.Certificate, nextKey)
		}
	})
}
