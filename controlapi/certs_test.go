package controlapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/controlclient"
	"cellvisor/domain"
	"cellvisor/edgeapi"
	"cellvisor/internal/testcert"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
	"cellvisor/tlsseal"
)

// logBuf is a zap sink the test greps.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) Sync() error                 { return nil }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// keyBody is a PEM key's base64 body, which no answer or log may carry.
func keyBody(keyPEM []byte) string {
	lines := strings.Split(strings.TrimSpace(string(keyPEM)), "\n")
	return strings.Join(lines[1:len(lines)-1], "")
}

// noKey fails when any of keys' bodies (or a line of one) is in s.
func noKey(t *testing.T, where, s string, keys ...[]byte) {
	t.Helper()
	flat := strings.ReplaceAll(strings.ReplaceAll(s, "\\n", ""), "\n", "")
	for _, k := range keys {
		if body := keyBody(k); strings.Contains(flat, body) || strings.Contains(s, body[:40]) {
			t.Fatalf("%s carries a private key", where)
		}
	}
}

const tlsConfig = `{"hostnames":[%s],"routes":[{"prefix":"/","respond":{"status":200,"body":"hi\n"}}],"tls":{"certificate":%q}}`

func publishTLS(e *env, name, cert string, hosts ...string) (adminapi.PublishedView, error) {
	q := make([]string, len(hosts))
	for i, h := range hosts {
		q[i] = fmt.Sprintf("%q", h)
	}
	return e.admin.Publish(context.Background(), name, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(fmt.Sprintf(tlsConfig, strings.Join(q, ","), cert))})
}

// refused checks an admin refusal: its status and the rule it names.
func refused(t *testing.T, err error, status int, rule string) {
	t.Helper()
	var ae *adminapi.Error
	if !errors.As(err, &ae) || ae.Status != status || !strings.Contains(ae.Message, rule) {
		t.Fatalf("got %v, want HTTP %d naming %q", err, status, rule)
	}
}

func TestCertificatesSealedToEachEdge(t *testing.T) {
	for _, db := range []struct {
		name string
		dsn  func(testing.TB) string
	}{
		{store.SQLite, func(t testing.TB) string { return filepath.Join(t.TempDir(), "control.db") }},
		{store.Postgres, testutil.Postgres},
	} {
		t.Run(db.name, func(t *testing.T) {
			logs := &logBuf{}
			key := make([]byte, 32)
			rand.Read(key)
			e := serveOn(t, db.dsn(t), key, func(o *controlapi.Options) {
				o.Logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), logs, zap.DebugLevel))
			})
			runCertificates(t, e, logs)
		})
	}
}

// oldAgent enrolls as an agent from before encryption keys: its request
// carries no encryption_key.
type oldAgent struct{ rt http.RoundTripper }

func (o oldAgent) RoundTrip(r *http.Request) (*http.Response, error) {
	var m map[string]any
	data, _ := io.ReadAll(r.Body)
	if json.Unmarshal(data, &m) == nil {
		delete(m, "encryption_key")
		data, _ = json.Marshal(m)
	}
	r = r.Clone(r.Context())
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(data)), int64(len(data))
	return o.rt.RoundTrip(r)
}

// enrollOld enrolls an edge as an agent from before encryption keys.
func (e *env) enrollOld(t *testing.T, token string) (*controlclient.Client, string) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
	hc := &http.Client{Transport: oldAgent{&http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}}
	dir := t.TempDir()
	id, err := controlclient.Enroll(ctx(t), controlclient.EnrollOptions{URL: e.edgeURL, Token: token, CAFile: e.caFile,
		Dir: filepath.Join(dir, "identity"), IdentityFile: filepath.Join(dir, "identity.json"), HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	return e.client(t, dir), id.EdgeID
}

// rawGet is an admin GET's body as sent.
func (e *env) rawGet(t *testing.T, path string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx(t), http.MethodGet, e.admin.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+e.admin.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d, %v", path, resp.StatusCode, err)
	}
	return string(data)
}

func runCertificates(t *testing.T, e *env, logs *logBuf) {
	const dom = "shop.example.test"
	good := testcert.New(t, testcert.Options{Names: []string{dom, "*." + dom}})
	put := func(name string, c testcert.Chain, chain []byte, replace bool) (adminapi.CertificateView, error) {
		if chain == nil {
			chain = c.PEM()
		}
		return e.admin.PutCertificate(ctx(t), name, adminapi.CertificateRequest{Chain: string(chain), Key: string(c.Key), Replace: replace})
	}

	// Refusals name the rule and store nothing.
	weak := testcert.New(t, testcert.Options{Names: []string{dom}, Key: "rsa-1024"})
	_, err := put("shop", weak, nil, false)
	refused(t, err, http.StatusBadRequest, "key type: RSA 1024 bits")
	_, err = e.admin.PutCertificate(ctx(t), "shop", adminapi.CertificateRequest{Chain: string(good.PEM()), Key: string(weak.Key)})
	refused(t, err, http.StatusBadRequest, "key match")
	_, err = put("shop", good, append(append([]byte{}, good.Intermediate...), good.Leaf...), false)
	refused(t, err, http.StatusBadRequest, "chain order")
	_, err = put("Bad.Name", good, nil, false)
	refused(t, err, http.StatusBadRequest, "certificate name")
	if l, err := e.admin.Certificates(ctx(t)); err != nil || len(l) != 0 {
		t.Fatalf("refused uploads stored %+v, %v", l, err)
	}

	v, err := put("shop", good, nil, false)
	fp, _ := domain.ChainFingerprint(string(good.PEM()))
	if err != nil || v.Fingerprint != fp || len(v.Names) != 2 || v.Issuer == "" || v.NotAfter.IsZero() {
		t.Fatalf("put: %+v, %v", v, err)
	}
	_, err = put("shop", good, nil, false)
	refused(t, err, http.StatusConflict, "--replace")

	// An edge of today enrolls with its encryption key; one of before
	// (no key) gets its entries without keys until it registers one.
	a, b := e.createEdge(t, "a"), e.createEdge(t, "b")
	ca, ida, dirA := e.enroll(t, a.Token)
	encA, err := controlclient.LoadEncryptionKey(filepath.Join(dirA, "identity"))
	if err != nil {
		t.Fatal(err)
	}
	cb, idB := e.enrollOld(t, b.Token)
	if v, err := e.admin.Edge(ctx(t), a.Edge.ID); err != nil || v.EncryptionKeyID != tlsseal.KeyID(encA.PublicKey()) || v.HTTPSKeys != "" {
		t.Fatalf("edge a %+v, %v", v, err)
	}
	if v, err := e.admin.Edge(ctx(t), idB); err != nil || !strings.Contains(v.HTTPSKeys, "withheld") || v.EncryptionKeyID != "" {
		t.Fatalf("edge b %+v, %v", v, err)
	}

	// Publishing checks the certificate.
	_, err = publishTLS(e, dom, "nope", dom)
	refused(t, err, http.StatusBadRequest, "no such certificate")
	_, err = publishTLS(e, dom, "shop", dom, "a.b."+dom)
	refused(t, err, http.StatusBadRequest, "does not cover hostname a.b."+dom)
	_, err = e.admin.Publish(ctx(t), dom, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(
		fmt.Sprintf(`{"hostnames":[%q],"routes":[{"prefix":"/","respond":{"status":200}}],"tls":{"certificate":"shop","chain":%q,"fingerprint":%q}}`, dom, good.PEM(), fp))})
	refused(t, err, http.StatusBadRequest, "filled by the control API")
	soon := testcert.New(t, testcert.Options{Names: []string{"soon.example.test"}, NotAfter: time.Now().Add(3 * 24 * time.Hour)})
	if _, err := put("soon", soon, nil, false); err != nil {
		t.Fatal(err)
	}
	_, err = publishTLS(e, "soon.example.test", "soon", "soon.example.test")
	refused(t, err, http.StatusBadRequest, "within the margin")
	if _, err := publishTLS(e, dom, "shop", dom, "www."+dom); err != nil {
		t.Fatal(err)
	}

	// Edge a's entry carries the key sealed to it, signed with the entry;
	// the artifact carries the chain and its fingerprint.
	entryOf := func(c *controlclient.Client, edgeID string) (manifest.Entry, domain.Domain) {
		t.Helper()
		m, err := manifest.Collect(ctx(t), c.Page, edgeID, 0)
		if err != nil || len(m.Entries) != 1 {
			t.Fatalf("collect: %+v, %v", m, err)
		}
		art, err := c.Artifact(ctx(t), m.Entries[0].SHA256)
		if err != nil {
			t.Fatal(err)
		}
		d, err := domain.Decode(art)
		if err != nil {
			t.Fatal(err)
		}
		return m.Entries[0], d
	}
	en, d := entryOf(ca, ida.EdgeID)
	if d.TLS == nil || d.TLS.Fingerprint != fp || d.TLS.Chain == "" || en.Key == nil {
		t.Fatalf("entry %+v, tls %+v", en, d.TLS)
	}
	key, err := tlsseal.Open(encA, ida.EdgeID, dom, fp, *en.Key)
	if err != nil || !bytes.Equal(key, good.Key) {
		t.Fatalf("open the seal: %v", err)
	}
	if _, err := tlsseal.Open(encA, idB, dom, fp, *en.Key); !errors.Is(err, tlsseal.ErrOpen) {
		t.Fatalf("a's seal opened as b's: %v", err)
	}
	noKey(t, "the manifest", fmt.Sprint(en), good.Key)

	// Edge b: no key, until it registers one over mutual TLS.
	if en, _ := entryOf(cb, idB); en.Key != nil {
		t.Fatalf("b's entry carries a key before b registered one: %+v", en.Key)
	}
	encB, err := tlsseal.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := cb.RegisterEncryptionKey(ctx(t), encB.PublicKey()); err != nil {
		t.Fatal(err)
	}
	enB, _ := entryOf(cb, idB)
	if enB.Key == nil {
		t.Fatal("b's entry has no key after it registered one")
	}
	if got, err := tlsseal.Open(encB, idB, dom, fp, *enB.Key); err != nil || !bytes.Equal(got, good.Key) {
		t.Fatalf("b opens its seal: %v", err)
	}
	if _, err := tlsseal.Open(encA, ida.EdgeID, dom, fp, *enB.Key); !errors.Is(err, tlsseal.ErrUnknownKey) {
		t.Fatalf("b's seal opened by a's key: %v", err)
	}

	// The snapshot carries the sealed key too.
	rc, err := ca.Snapshot(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := manifest.ReadSnapshot(ctx(t), rc, manifest.SnapshotLimit, t.TempDir())
	rc.Close()
	if err != nil || len(snap.Manifest.Entries) != 1 || snap.Manifest.Entries[0].Key == nil || *snap.Manifest.Entries[0].Key != *en.Key {
		t.Fatalf("snapshot %+v, %v", snap.Manifest, err)
	}
	snap.Close()

	// Delete is refused while used; a replacement republishes.
	err = e.admin.DeleteCertificate(ctx(t), "shop")
	refused(t, err, http.StatusConflict, "used by "+dom)
	narrow := testcert.New(t, testcert.Options{Names: []string{dom}})
	_, err = put("shop", narrow, nil, true)
	refused(t, err, http.StatusBadRequest, "does not cover hostname www."+dom+" of domain "+dom)
	if c, err := e.admin.Certificate(ctx(t), "shop"); err != nil || c.Fingerprint != fp {
		t.Fatalf("after a refused replacement: %+v, %v", c, err)
	}
	next := testcert.New(t, testcert.Options{Names: []string{dom, "*." + dom}, Key: "ed25519"})
	rv, err := put("shop", next, nil, true)
	fp2, _ := domain.ChainFingerprint(string(next.PEM()))
	if err != nil || rv.Fingerprint != fp2 || rv.Republished[dom] != 2 || len(rv.Failed) != 0 {
		t.Fatalf("replace: %+v, %v", rv, err)
	}
	en, d = entryOf(ca, ida.EdgeID)
	if d.TLS.Fingerprint != fp2 || en.Revision != 2 {
		t.Fatalf("after the replacement: revision %d, fingerprint %s", en.Revision, d.TLS.Fingerprint)
	}
	if got, err := tlsseal.Open(encA, ida.EdgeID, dom, fp2, *en.Key); err != nil || !bytes.Equal(got, next.Key) {
		t.Fatalf("open the new seal: %v", err)
	}

	// A rollback to revision 1 seals revision 1's key again; one whose
	// certificate key was deleted is refused.
	if _, err := e.admin.RollbackDomain(ctx(t), dom, 1); err != nil {
		t.Fatal(err)
	}
	en, d = entryOf(ca, ida.EdgeID)
	if got, err := tlsseal.Open(encA, ida.EdgeID, dom, fp, *en.Key); err != nil || !bytes.Equal(got, good.Key) || d.TLS.Fingerprint != fp {
		t.Fatalf("open the rolled-back seal: %v", err)
	}
	if _, err := publishTLS(e, dom, "shop", dom, "www."+dom); err != nil { // revision 3, the replacement
		t.Fatal(err)
	}
	tmp := testcert.New(t, testcert.Options{Names: []string{dom}})
	if _, err := put("tmp", tmp, nil, false); err != nil {
		t.Fatal(err)
	}
	if _, err := publishTLS(e, dom, "tmp", dom); err != nil { // revision 4
		t.Fatal(err)
	}
	if _, err := publishTLS(e, dom, "shop", dom, "www."+dom); err != nil { // revision 5
		t.Fatal(err)
	}
	if err := e.admin.DeleteCertificate(ctx(t), "tmp"); err != nil {
		t.Fatal(err)
	}
	_, err = e.admin.RollbackDomain(ctx(t), dom, 4)
	refused(t, err, http.StatusConflict, "whose key was deleted")
	en, _ = entryOf(ca, ida.EdgeID)
	if en.Revision != 5 || en.Key == nil {
		t.Fatalf("after the refused rollback: %+v", en)
	}

	// A replica on the same database shares the key-encryption key.
	r := e.replica(t)
	if _, err := r.admin.PutCertificate(ctx(t), "shop2", adminapi.CertificateRequest{Chain: string(good.PEM()), Key: string(good.Key)}); err != nil {
		t.Fatal(err)
	}
	if _, err := publishTLS(r, "x."+dom, "shop2", "x."+dom); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Collect(ctx(t), r.client(t, dirA).Page, ida.EdgeID, 0)
	if err != nil || len(m.Entries) != 2 {
		t.Fatalf("collect after the replica's publish: %+v, %v", m, err)
	}
	for _, en := range m.Entries {
		if en.Domain == "x."+dom {
			if got, err := tlsseal.Open(encA, ida.EdgeID, en.Domain, fp, *en.Key); err != nil || !bytes.Equal(got, good.Key) {
				t.Fatalf("the replica's seal: %v", err)
			}
		}
	}

	// A renewal's rotation of the encryption key: registered, then
	// current, the old one kept; the edge's keys are sealed to the new one.
	if err := ca.RotateEncryptionKey(ctx(t)); err != nil {
		t.Fatal(err)
	}
	keys, err := controlclient.EncryptionKeys(filepath.Join(dirA, "identity"))
	if err != nil || len(keys) != 2 || keys[0].Equal(encA) || !keys[1].Equal(encA) {
		t.Fatalf("keys after the rotation: %d, %v", len(keys), err)
	}
	if v, err := e.admin.Edge(ctx(t), a.Edge.ID); err != nil || v.EncryptionKeyID != tlsseal.KeyID(keys[0].PublicKey()) {
		t.Fatalf("edge a after the rotation %+v, %v", v, err)
	}
	m, err = manifest.Collect(ctx(t), ca.Page, ida.EdgeID, 0)
	if err != nil || len(m.Entries) != 2 {
		t.Fatalf("collect after the rotation: %+v, %v", m, err)
	}
	for _, en := range m.Entries {
		if en.Key == nil || en.Key.KeyID != tlsseal.KeyID(keys[0].PublicKey()) {
			t.Fatalf("%s sealed to %+v after the rotation", en.Domain, en.Key)
		}
	}

	// No answer, and no log line, carries a key.
	for _, p := range []string{adminapi.PathCertificates, adminapi.PathCertificates + "/shop", adminapi.PathDomains + "/" + dom, adminapi.PathEdges + "/" + a.Edge.ID} {
		noKey(t, "GET "+p, e.rawGet(t, p), good.Key, next.Key, soon.Key)
	}
	if !strings.Contains(logs.String(), "certificate stored") {
		t.Fatal("the logs were not captured")
	}
	noKey(t, "the logs", logs.String(), good.Key, next.Key, soon.Key, weak.Key, tmp.Key, narrow.Key)
}

// An exact enrollment retry repeats the encryption key too: the same CSR
// with another key is refused as another CSR is.
func TestEnrollmentRetryCoversTheEncryptionKey(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	created := e.createEdge(t, "fra-1")
	k1, _ := tlsseal.GenerateKey()
	k2, _ := tlsseal.GenerateKey()
	req := csr(t)
	post := func(enc string) int {
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
		defer hc.CloseIdleConnections()
		body, _ := json.Marshal(edgeapi.EnrollRequest{Token: created.Token, CSR: req, EncryptionKey: enc})
		resp, err := hc.Post(e.edgeURL+edgeapi.PathEnroll, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("AAAA"); code != http.StatusBadRequest {
		t.Fatalf("malformed key: HTTP %d, want 400", code)
	}
	if code := post(tlsseal.EncodePublic(k1.PublicKey())); code != http.StatusOK {
		t.Fatalf("enroll: HTTP %d", code)
	}
	if code := post(tlsseal.EncodePublic(k1.PublicKey())); code != http.StatusOK {
		t.Fatalf("exact retry: HTTP %d", code)
	}
	if code := post(tlsseal.EncodePublic(k2.PublicKey())); code != http.StatusConflict {
		t.Fatalf("same CSR, another key: HTTP %d, want 409", code)
	}
	if v, err := e.admin.Edge(ctx(t), created.Edge.ID); err != nil || v.EncryptionKeyID != tlsseal.KeyID(k1.PublicKey()) {
		t.Fatalf("edge %+v, %v", v, err)
	}
}
