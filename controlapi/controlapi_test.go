package controlapi_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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

// env is a control API on real TLS listeners over a real store.
type env struct {
	srv     *controlapi.Server
	edgeURL string
	admin   *adminapi.Client
	caFile  string
	st      *store.Store
	sealKey []byte
	dsn     string
}

func eachStore(t *testing.T, f func(t *testing.T, e *env)) {
	t.Run(store.SQLite, func(t *testing.T) { f(t, start(t, filepath.Join(t.TempDir(), "control.db"))) })
	t.Run(store.Postgres, func(t *testing.T) { f(t, start(t, testutil.Postgres(t))) })
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func start(t testing.TB, dsn string) *env {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	return serveOn(t, dsn, key)
}

// replica starts a second control API on the same database and key file.
func (e *env) replica(t *testing.T) *env {
	return serveOn(t, e.dsn, e.sealKey)
}

// serveWith is serveOn with options changed by set, if not nil.
func serveWith(t testing.TB, dsn string, key []byte, set func(*controlapi.Options)) *env {
	t.Helper()
	if set == nil {
		return serveOn(t, dsn, key)
	}
	return serveOn(t, dsn, key, set)
}

// serveOn serves the control API on the store at dsn, with options changed
// by opts in order.
func serveOn(t testing.TB, dsn string, key []byte, opts ...func(*controlapi.Options)) *env {
	t.Helper()
	st, err := store.Open(ctx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	o := controlapi.Options{Store: st, SealKey: key, AdminToken: "test-admin-token-0123456789", Refresh: 50 * time.Millisecond, SnapshotDir: t.TempDir()}
	for _, f := range opts {
		f(&o)
	}
	srv, err := controlapi.New(ctx(t), o)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	// The listeners Serve runs: bounded, the edge's TLS handshakes run by
	// its listener (so httptest serves them as plain ones).
	edge := httptest.NewUnstartedServer(srv.EdgeHandler())
	edgeLn, edgeTLS, err := srv.ListenEdge(edge.Listener, controlapi.ListenLimits{})
	if err != nil {
		t.Fatal(err)
	}
	edge.Listener, edge.Config.TLSConfig, edge.Config.ConnState = edgeLn, edgeTLS, edgeLn.ConnState
	edge.Start()
	t.Cleanup(edge.Close)
	edge.URL = "https://" + edgeLn.Addr().String()
	admin := httptest.NewUnstartedServer(srv.AdminHandler())
	adminLn, err := srv.ListenAdmin(admin.Listener, nil)
	if err != nil {
		t.Fatal(err)
	}
	admin.Listener, admin.Config.ConnState = adminLn, adminLn.ConnState
	admin.Start()
	t.Cleanup(admin.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, []byte(srv.CAPEM()), 0o644); err != nil {
		t.Fatal(err)
	}
	return &env{srv: srv, edgeURL: edge.URL, admin: &adminapi.Client{URL: admin.URL, Token: "test-admin-token-0123456789"},
		caFile: caFile, st: st, sealKey: key, dsn: dsn}
}

func (e *env) createEdge(t testing.TB, name string) adminapi.CreatedEdge {
	t.Helper()
	c, err := e.admin.CreateEdge(ctx(t), adminapi.EdgeRequest{Name: name, Org: "acme", Country: "de", Continent: "eu", MgmtIPv4: "192.0.2.10"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// enroll enrolls an edge into a fresh identity directory and returns its
// client.
func (e *env) enroll(t testing.TB, token string) (*controlclient.Client, controlclient.Identity, string) {
	t.Helper()
	dir := t.TempDir()
	id, err := controlclient.Enroll(ctx(t), controlclient.EnrollOptions{URL: e.edgeURL, Token: token, CAFile: e.caFile,
		Dir: filepath.Join(dir, "identity"), IdentityFile: filepath.Join(dir, "identity.json"), Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	return e.client(t, dir), id, dir
}

// client is an edge's client of this replica, from the identity enrolled
// into dir (through any replica).
func (e *env) client(t testing.TB, dir string) *controlclient.Client {
	t.Helper()
	c, err := controlclient.New(controlclient.Options{URL: e.edgeURL, Dir: filepath.Join(dir, "identity")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdle)
	return c
}

func csr(t *testing.T) string {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "anything"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// rawEnroll posts an enrollment as-is and returns the status and answer.
func (e *env) rawEnroll(t *testing.T, token, csrPEM string) (int, edgeapi.EnrollResponse) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer hc.CloseIdleConnections()
	body, _ := json.Marshal(edgeapi.EnrollRequest{Token: token, CSR: csrPEM})
	resp, err := hc.Post(e.edgeURL+edgeapi.PathEnroll, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var er edgeapi.EnrollResponse
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&er); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, er
}

func TestEnrollmentRetriesAndRefusals(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		created := e.createEdge(t, "fra-1")
		if created.Edge.Enrollment != adminapi.EnrollmentPending || created.Edge.Slots != 8 || created.Edge.Country != "DE" || !strings.HasPrefix(created.Token, "cvt_") {
			t.Fatalf("created %+v", created)
		}
		req := csr(t)
		code, first := e.rawEnroll(t, created.Token, req)
		if code != http.StatusOK {
			t.Fatalf("enroll: HTTP %d", code)
		}
		b, _ := pem.Decode([]byte(first.Certificate))
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil || cert.Subject.CommonName != created.Edge.ID || len(cert.IPAddresses) != 0 || len(cert.DNSNames) != 0 {
			t.Fatalf("certificate CN %q IPs %v DNS %v, %v", cert.Subject.CommonName, cert.IPAddresses, cert.DNSNames, err)
		}
		if first.ControlPublicKey != e.srv.PublicKey() || first.Slots != 8 {
			t.Fatalf("enroll answer %+v", first)
		}
		// An exact retry gets the very same certificate.
		if code, again := e.rawEnroll(t, created.Token, req); code != http.StatusOK || again.Certificate != first.Certificate {
			t.Fatalf("exact retry: HTTP %d, same certificate %v", code, again.Certificate == first.Certificate)
		}
		// A different CSR for the consumed token fails closed.
		if code, _ := e.rawEnroll(t, created.Token, csr(t)); code != http.StatusConflict {
			t.Fatalf("different CSR: HTTP %d, want 409", code)
		}
		if code, _ := e.rawEnroll(t, "cvt_never-issued", csr(t)); code != http.StatusUnauthorized {
			t.Fatalf("unknown token: HTTP %d, want 401", code)
		}
		if code, _ := e.rawEnroll(t, created.Token, "not a csr"); code != http.StatusBadRequest {
			t.Fatalf("malformed CSR: HTTP %d, want 400", code)
		}
	})
}

func TestRotationRefusesTheOldIdentity(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		created := e.createEdge(t, "fra-1")
		c, id, dir := e.enroll(t, created.Token)
		for _, f := range []string{"key.pem", "encryption-key.pem", "cert.pem", "ca.pem", "server-ca.pem"} {
			if st, err := os.Stat(filepath.Join(dir, "identity", f)); err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("%s: %v, %v", f, st, err)
			}
		}
		if id.EdgeID != created.Edge.ID {
			t.Fatalf("identity %+v", id)
		}
		if _, err := c.Page(ctx(t), 1, ""); !errors.Is(err, manifest.ErrNoChange) {
			t.Fatalf("first poll: %v, want no change", err)
		}
		// Enrolling again without --replace is refused, changing nothing.
		if _, err := controlclient.Enroll(ctx(t), controlclient.EnrollOptions{URL: e.edgeURL, Token: created.Token, CAFile: e.caFile,
			Dir: filepath.Join(dir, "identity"), IdentityFile: filepath.Join(dir, "identity.json")}); !errors.Is(err, controlclient.ErrEnrolled) {
			t.Fatalf("second enroll: %v", err)
		}
		rotated, err := e.admin.Rotate(ctx(t), created.Edge.ID)
		if err != nil || rotated.Token == created.Token || rotated.Edge.Enrollment != adminapi.EnrollmentPending {
			t.Fatalf("rotate: %+v, %v", rotated, err)
		}
		_, err = c.Page(ctx(t), 1, "")
		var he *controlclient.HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
			t.Fatalf("poll with the rotated certificate: %v, want 401", err)
		}
		if code, _ := e.rawEnroll(t, created.Token, csr(t)); code != http.StatusUnauthorized {
			t.Fatalf("rotated-away token: HTTP %d, want 401", code)
		}
		// Re-enrolling with the new token: the running client picks up the
		// new certificate.
		if _, err := controlclient.Enroll(ctx(t), controlclient.EnrollOptions{URL: e.edgeURL, Token: rotated.Token, CAFile: e.caFile,
			Dir: filepath.Join(dir, "identity"), IdentityFile: filepath.Join(dir, "identity.json"), Replace: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Page(ctx(t), 1, ""); !errors.Is(err, manifest.ErrNoChange) {
			t.Fatalf("poll after re-enrollment: %v", err)
		}
		v, _ := e.admin.Edge(ctx(t), created.Edge.ID)
		if v.Enrollment != adminapi.EnrollmentEnrolled || v.Rotations != 1 {
			t.Fatalf("edge after re-enrollment %+v", v)
		}
	})
}

func TestUnauthenticatedAndForeignCertificatesAreRefused(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
	// No client certificate: TLS succeeds, the handler refuses.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	t.Cleanup(hc.CloseIdleConnections)
	for _, p := range []string{edgeapi.PathManifest + "?after=0", edgeapi.PathSnapshot, edgeapi.PathTasks} {
		resp, err := hc.Get(e.edgeURL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s without a client certificate: HTTP %d", p, resp.StatusCode)
		}
	}
	// A certificate from another CA, with a real edge's id as its CN: the
	// TLS handshake fails.
	created := e.createEdge(t, "fra-1")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: bigOne(), Subject: pkix.Name{CommonName: created.Edge.ID}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	// GetClientCertificate sends it even though the server names another CA.
	forged := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
		}}}}
	t.Cleanup(forged.CloseIdleConnections)
	if resp, err := forged.Get(e.edgeURL + edgeapi.PathManifest + "?after=0"); err == nil {
		resp.Body.Close()
		t.Fatalf("self-signed client certificate: HTTP %d, want a failed handshake", resp.StatusCode)
	}
	// The admin API wants its token.
	bad := &adminapi.Client{URL: e.admin.URL, Token: "wrong"}
	var ae *adminapi.Error
	if _, err := bad.Edges(ctx(t)); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized || !strings.Contains(err.Error(), "rejected") {
		t.Fatalf("admin with a wrong token: %v, want 401 saying the token was rejected", err)
	}
	none := &adminapi.Client{URL: e.admin.URL}
	if _, err := none.Edges(ctx(t)); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized || !strings.Contains(err.Error(), "required") {
		t.Fatalf("admin without a token: %v, want 401 saying a token is required", err)
	}
}

func TestCreateEdgeRefusesNamingTheField(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	ok := adminapi.EdgeRequest{Name: "fra-1", Org: "acme", Country: "DE", Continent: "EU"}
	for _, tc := range []struct {
		field string
		edit  func(*adminapi.EdgeRequest)
	}{
		{"name", func(r *adminapi.EdgeRequest) { r.Name = "" }},
		{"name", func(r *adminapi.EdgeRequest) { r.Name = "Bad Name" }},
		{"org", func(r *adminapi.EdgeRequest) { r.Org = "" }},
		{"country", func(r *adminapi.EdgeRequest) { r.Country = "XX" }},
		{"country", func(r *adminapi.EdgeRequest) { r.Country = "DEU" }},
		{"continent", func(r *adminapi.EdgeRequest) { r.Continent = "Europe" }},
		{"slots", func(r *adminapi.EdgeRequest) { r.Slots = 33 }},
		{"slots", func(r *adminapi.EdgeRequest) { r.Slots = -1 }},
		{"mgmt_ipv4", func(r *adminapi.EdgeRequest) { r.MgmtIPv4 = "2001:db8::1" }},
		{"mgmt_ipv6", func(r *adminapi.EdgeRequest) { r.MgmtIPv6 = "192.0.2.1" }},
		{"mgmt_ipv6", func(r *adminapi.EdgeRequest) { r.MgmtIPv6 = "::ffff:192.0.2.1" }},
	} {
		r := ok
		tc.edit(&r)
		_, err := e.admin.CreateEdge(ctx(t), r)
		var ae *adminapi.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.HasPrefix(ae.Message, tc.field+":") {
			t.Errorf("%+v: %v, want 400 naming %s", r, err, tc.field)
		}
	}
	if edges, _ := e.admin.Edges(ctx(t)); len(edges) != 0 {
		t.Fatalf("refused requests created %d edges", len(edges))
	}
	r := ok
	r.Slots = 32
	if c, err := e.admin.CreateEdge(ctx(t), r); err != nil || c.Edge.Slots != 32 {
		t.Fatalf("32 slots: %+v, %v", c, err)
	}
	if _, err := e.admin.CreateEdge(ctx(t), ok); err == nil {
		t.Fatal("duplicate name accepted")
	}
}

const demoConfig = `{"hostnames":["%s"],"routes":[{"prefix":"/","respond":{"status":200,"body":"%s\n"}}]}`

func publish(t *testing.T, e *env, name, body string) adminapi.PublishedView {
	t.Helper()
	p, err := e.admin.Publish(ctx(t), name, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(fmt.Sprintf(demoConfig, name, body))})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestManifestPollingArtifactsSnapshotAndAcks(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		a, b := e.createEdge(t, "a"), e.createEdge(t, "b")
		ca, ida, _ := e.enroll(t, a.Token)
		cb, idb, _ := e.enroll(t, b.Token)
		p := publish(t, e, "shop.example.test", "v1")
		// Fanned out: each edge's poll builds its sequence 2 (1 is its
		// first manifest, empty).
		if p.Domain.Revision != 1 || len(p.Edges) != 0 || p.EdgesPending != 2 || p.Publish == 0 {
			t.Fatalf("published %+v", p)
		}
		if v, _ := e.admin.Edge(ctx(t), a.Edge.ID); v.Sequence != 1 {
			t.Fatalf("edge a at sequence %d before its poll, want 1", v.Sequence)
		}
		pub, _ := base64.StdEncoding.DecodeString(ida.ControlPublicKey)
		m, err := manifest.Collect(ctx(t), ca.Page, ida.EdgeID, 0)
		if err != nil || m.Sequence != 2 || len(m.Entries) != 1 {
			t.Fatalf("collect: %+v, %v", m, err)
		}
		art, err := ca.Artifact(ctx(t), m.Entries[0].SHA256)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Entries[0].Verify(ed25519.PublicKey(pub), ida.EdgeID, art); err != nil {
			t.Fatalf("verify: %v", err)
		}
		// The entry signed for edge a is refused for edge b.
		if err := m.Entries[0].Verify(ed25519.PublicKey(pub), idb.EdgeID, art); !errors.Is(err, manifest.ErrSignature) {
			t.Fatalf("a's entry verified for b: %v", err)
		}
		if _, err := ca.Page(ctx(t), 2, ""); !errors.Is(err, manifest.ErrNoChange) {
			t.Fatalf("poll at the current sequence: %v, want no change", err)
		}
		rc, err := cb.Snapshot(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		snap, err := manifest.ReadSnapshot(ctx(t), rc, manifest.SnapshotLimit, t.TempDir())
		rc.Close()
		if err != nil || snap.Manifest.EdgeID != idb.EdgeID || len(snap.Manifest.Entries) != 1 {
			t.Fatalf("snapshot %+v, %v", snap, err)
		}
		if data, err := snap.Artifact(ctx(t), snap.Manifest.Entries[0].SHA256); err != nil || snap.Manifest.Entries[0].Verify(ed25519.PublicKey(pub), idb.EdgeID, data) != nil {
			t.Fatalf("snapshot artifact: %v", err)
		}
		snap.Close()
		if err := ca.Ack(ctx(t), manifest.Ack{Sequence: 2, Status: manifest.AckApplied, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := ca.Ack(ctx(t), manifest.Ack{Sequence: 1, Status: "bogus"}); err == nil {
			t.Fatal("bogus ack accepted")
		}
		// A refusal with no sequence (an unreadable snapshot) is taken, so
		// that it does not block the agent's journal.
		if err := ca.Ack(ctx(t), manifest.Ack{Sequence: 0, Status: manifest.AckRefused, Reason: "recovery snapshot: invalid"}); err != nil {
			t.Fatalf("refusal of sequence 0: %v", err)
		}
		v, _ := e.admin.Edge(ctx(t), a.Edge.ID)
		if v.ActiveSequence != 2 || len(v.Acks) != 1 || v.LastSeen == nil {
			t.Fatalf("edge after ack %+v", v)
		}
		// An edge without the domain's pool gets neither entry nor artifact.
		c, err := e.admin.CreateEdge(ctx(t), adminapi.EdgeRequest{Name: "c", Org: "acme", Country: "FR", Continent: "EU", Slots: 1})
		if err != nil {
			t.Fatal(err)
		}
		if c.Edge.Sequence != 1 {
			t.Fatalf("new edge in shared-default starts at sequence %d, want 1", c.Edge.Sequence)
		}
		// A bad config is refused and nothing moves.
		_, err = e.admin.Publish(ctx(t), "shop.example.test", adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(`{"hostnames":["Not Valid"],"routes":[]}`)})
		var ae *adminapi.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
			t.Fatalf("bad config: %v", err)
		}
		if v, _ := e.admin.Edge(ctx(t), a.Edge.ID); v.Sequence != 2 {
			t.Fatalf("a refused publish advanced the sequence to %d", v.Sequence)
		}
		// A status report shows up in the admin view, cells and security events.
		status := `{"version":"t","runtime":{"binary":"/usr/sbin/nginx","version":"nginx/1.22.2","superseded":1,"upgrade":"waiting","reason":"manual"},
			"slots":[{"name":"cell-01","pool":"shared-default","state":"ready","sequence":1,
			"runtime":{"version":"nginx/1.22.1","superseded":true,"current":"nginx/1.22.2"},
			"cell":{"security":{"auth_failures":2,"last_at":1800000000.5,"last_reason":"bad signature"}}}]}`
		if err := ca.Report(ctx(t), edgeapi.StatusReport{At: time.Now(), Status: json.RawMessage(status)}); err != nil {
			t.Fatal(err)
		}
		v, _ = e.admin.Edge(ctx(t), a.Edge.ID)
		if len(v.Cells) != 1 || v.Cells[0].State != "ready" || len(v.SecurityEvents) != 1 || v.SecurityEvents[0].AuthFailures != 2 {
			t.Fatalf("edge after a status report: cells %+v security %+v", v.Cells, v.SecurityEvents)
		}
		// Which cells still run a replaced binary, and what the edge runs.
		if c := v.Cells[0]; c.RuntimeVersion != "nginx/1.22.1" || !c.RuntimeSuperseded {
			t.Errorf("cell view %+v, want its runtime nginx/1.22.1, superseded", c)
		}
		if r := v.Runtime; r == nil || r.Version != "nginx/1.22.2" || r.Superseded != 1 || r.Upgrade != "waiting" {
			t.Errorf("edge runtime %+v, want nginx/1.22.2 with one superseded cell, waiting", r)
		}
	})
}

func TestPagesOf500(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	a := e.createEdge(t, "a")
	c, id, _ := e.enroll(t, a.Token)
	for i := range manifest.MaxEntries + 3 {
		publish(t, e, fmt.Sprintf("d%04d.example.test", i), "x")
	}
	pages := 0
	m, err := manifest.Collect(ctx(t), func(ctx context.Context, after int64, cursor string) (manifest.Page, error) {
		p, err := c.Page(ctx, after, cursor)
		if err == nil {
			pages++
			if len(p.Entries) > manifest.MaxEntries {
				t.Errorf("page of %d entries", len(p.Entries))
			}
		}
		return p, err
	}, id.EdgeID, 0)
	// Sequence 1 is the edge's first manifest, empty; every publish since
	// is in the one its poll built.
	if err != nil || len(m.Entries) != manifest.MaxEntries+3 || pages != 2 || m.Sequence != 2 {
		t.Fatalf("collected %d entries in %d pages at sequence %d, %v", len(m.Entries), pages, m.Sequence, err)
	}
}

func TestTasksAreDeliveredByPolling(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		a := e.createEdge(t, "a")
		c, _, _ := e.enroll(t, a.Token)
		if _, err := e.admin.CreateTask(ctx(t), a.Edge.ID, adminapi.TaskRequest{Cell: "cell-09", Action: "drain"}); err == nil {
			t.Fatal("a task for cell-09 of an 8-slot edge was accepted")
		}
		task, err := e.admin.CreateTask(ctx(t), a.Edge.ID, adminapi.TaskRequest{Cell: "cell-01", Action: edgeapi.ActionDrain})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Page(ctx(t), 1, ""); !errors.Is(err, manifest.ErrNoChange) {
			t.Fatal(err)
		}
		select {
		case <-c.TasksPending():
		default:
			t.Fatal("the poll did not say a task is pending")
		}
		ts, err := c.Tasks(ctx(t))
		if err != nil || len(ts) != 1 || ts[0].ID != task.ID || ts[0].Action != "drain" || ts[0].Cell != "cell-01" {
			t.Fatalf("tasks %+v, %v", ts, err)
		}
		if err := c.AckTask(ctx(t), task.ID, edgeapi.TaskAck{State: edgeapi.TaskDone, Result: "drained"}); err != nil {
			t.Fatal(err)
		}
		if ts, _ := c.Tasks(ctx(t)); len(ts) != 0 {
			t.Fatalf("pending after ack: %+v", ts)
		}
		views, _ := e.admin.Tasks(ctx(t), a.Edge.ID)
		if len(views) != 1 || views[0].State != edgeapi.TaskDone || views[0].Result != "drained" {
			t.Fatalf("admin tasks %+v", views)
		}
	})
}

func bigOne() *big.Int { return big.NewInt(1) }

// An enrollment whose answer is lost is retried exactly: the agent kept
// its pending key and CSR, and gets the certificate issued the first time.
func TestEnrollmentAnswerLostThenRetried(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	created := e.createEdge(t, "fra-1")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
	upstream := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	t.Cleanup(upstream.CloseIdleConnections)
	var lost []byte
	proxy := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		resp, err := upstream.Post(e.edgeURL+r.URL.Path, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if lost == nil {
			lost = answer // the control API answered; the agent never hears it
			http.Error(w, "connection reset", http.StatusBadGateway)
			return
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(answer)
	}))
	proxy.TLS = e.srv.EdgeTLSConfig()
	proxy.StartTLS()
	t.Cleanup(proxy.Close)

	dir := t.TempDir()
	o := controlclient.EnrollOptions{URL: proxy.URL, Token: created.Token, CAFile: e.caFile,
		Dir: filepath.Join(dir, "identity"), IdentityFile: filepath.Join(dir, "identity.json")}
	if _, err := controlclient.Enroll(ctx(t), o); err == nil {
		t.Fatal("enrollment through a lost answer succeeded")
	}
	if _, err := os.Stat(o.IdentityFile); !os.IsNotExist(err) {
		t.Fatalf("identity written after a failed enrollment: %v", err)
	}
	id, err := controlclient.Enroll(ctx(t), o)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	var first edgeapi.EnrollResponse
	if err := json.Unmarshal(lost, &first); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(o.Dir, controlclient.CertFile))
	if string(got) != first.Certificate || id.EdgeID != created.Edge.ID {
		t.Fatal("the retry did not get the certificate issued the first time")
	}
	if left, _ := filepath.Glob(filepath.Join(o.Dir, "pending-*")); len(left) != 0 {
		t.Fatalf("pending files left: %v", left)
	}
}

// Two control replicas share one database: an edge enrolled through one
// polls through the other, and a domain published on one reaches edges
// polling the other once its cache catches up.
func TestReplicasShareOneDatabase(t *testing.T) {
	eachStore(t, func(t *testing.T, a *env) {
		b := a.replica(t)
		created := a.createEdge(t, "fra-1")
		// Enrolled through replica a, polling replica b.
		_, id, dir := a.enroll(t, created.Token)
		cb := b.client(t, dir)
		if _, err := cb.Page(ctx(t), 1, ""); !errors.Is(err, manifest.ErrNoChange) {
			t.Fatalf("poll through the other replica: %v", err)
		}
		publish(t, a, "shop.example.test", "v1")
		testutil.Eventually(t, 10*time.Second, func() error {
			m, err := manifest.Collect(ctx(t), cb.Page, id.EdgeID, 0)
			if err != nil {
				return err
			}
			if m.Sequence != 2 {
				return fmt.Errorf("sequence %d", m.Sequence)
			}
			return nil
		})
		// A rotation on b is refused on a at once for anything with a body,
		// and for the cheap poll within a's cache refresh.
		m, err := manifest.Collect(ctx(t), cb.Page, id.EdgeID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.admin.Rotate(ctx(t), created.Edge.ID); err != nil {
			t.Fatal(err)
		}
		ca := a.client(t, dir)
		_, err = ca.Artifact(ctx(t), m.Entries[0].SHA256)
		var he *controlclient.HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
			t.Fatalf("artifact with a certificate rotated on the other replica: %v", err)
		}
		testutil.Eventually(t, 10*time.Second, func() error {
			_, err := ca.Page(ctx(t), 1, "")
			if !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
				return fmt.Errorf("poll: %v", err)
			}
			return nil
		})
	})
}

// A deleted edge's certificate is refused by every replica, the cheap poll
// included, once its cache catches up.
func TestDeletedEdgeIsRefused(t *testing.T) {
	eachStore(t, func(t *testing.T, a *env) {
		b := a.replica(t)
		created := a.createEdge(t, "fra-1")
		_, _, dir := a.enroll(t, created.Token)
		cb := b.client(t, dir)
		if _, err := cb.Page(ctx(t), 1, ""); !errors.Is(err, manifest.ErrNoChange) {
			t.Fatalf("poll before the delete: %v", err)
		}
		if v, err := a.admin.DeleteEdge(ctx(t), created.Edge.ID); err != nil || v.ID != created.Edge.ID {
			t.Fatalf("delete: %+v, %v", v, err)
		}
		var ae *adminapi.Error
		if _, err := a.admin.Edge(ctx(t), created.Edge.ID); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
			t.Fatalf("show a deleted edge: %v", err)
		}
		testutil.Eventually(t, 10*time.Second, func() error {
			_, err := cb.Page(ctx(t), 1, "")
			var he *controlclient.HTTPError
			if !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
				return fmt.Errorf("poll on the other replica: %v", err)
			}
			return nil
		})
		if _, err := a.admin.DeleteEdge(ctx(t), created.Edge.ID); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
			t.Fatalf("delete twice: %v", err)
		}
	})
}

// An enrolled edge whose pools hold no domains gets its first manifest at
// once: sequence 1, no entries, its header and assignments signed for it,
// by pages and by a recovery snapshot, so that its agent activates it (its
// assigned cells start, serving nothing) instead of waiting at sequence 0.
func TestEmptyFirstManifestIsServed(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		created := e.createEdge(t, "empty")
		if created.Edge.Sequence != 1 {
			t.Fatalf("new edge at sequence %d, want 1", created.Edge.Sequence)
		}
		c, id, _ := e.enroll(t, created.Token)
		pub, _ := base64.StdEncoding.DecodeString(id.ControlPublicKey)
		m, err := manifest.Collect(ctx(t), c.Page, id.EdgeID, 0)
		if err != nil || m.Sequence != 1 || len(m.Entries) != 0 {
			t.Fatalf("collect: %+v, %v; want sequence 1, empty", m, err)
		}
		if _, err := m.VerifyHeader(ed25519.PublicKey(pub), id.EdgeID); err != nil {
			t.Fatalf("header: %v", err)
		}
		if m.Assignments == nil || m.Assignments.Cells["cell-01"] != "shared-default" {
			t.Fatalf("signed assignments %+v", m.Assignments)
		}
		rc, err := c.Snapshot(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		snap, err := manifest.ReadSnapshot(ctx(t), rc, manifest.SnapshotLimit, t.TempDir())
		rc.Close()
		if err != nil || snap.Manifest.Sequence != 1 || len(snap.Manifest.Entries) != 0 {
			t.Fatalf("snapshot %+v, %v", snap, err)
		}
		snap.Close()
	})
}
