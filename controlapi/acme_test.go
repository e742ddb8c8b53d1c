package controlapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
	"cellvisor/domain"
	"cellvisor/internal/pebbletest"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// fakeCell answers ACME HTTP-01 challenges as a cell does: with what the
// domain's newest artifact in the edge's manifest carries, on a loopback
// port, and records which hostnames the CA asked for.
type fakeCell struct {
	port int

	mu      sync.Mutex
	answers map[string]string
	asked   map[string]int
}

func newFakeCell(t *testing.T) *fakeCell {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &fakeCell{port: ln.Addr().(*net.TCPAddr).Port, answers: map[string]string{}, asked: map[string]int{}}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.Host)
		token, _ := strings.CutPrefix(r.URL.Path, "/.well-known/acme-challenge/")
		c.mu.Lock()
		c.asked[host]++
		ka, ok := c.answers[token]
		c.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(ka))
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return c
}

func (c *fakeCell) load(chs []domain.ACMEChallenge) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.answers)
	for _, ch := range chs {
		c.answers[ch.Token] = ch.KeyAuthorization
	}
}

func (c *fakeCell) askedFor(host string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked[host]
}

// runAgent polls the edge's manifest like an agent, loads the domain's
// challenges into the cell and acknowledges each sequence as applied,
// until the test ends.
func runAgent(t *testing.T, c *controlclient.Client, edgeID, name string, cell *fakeCell) {
	runAgentAcking(t, c, edgeID, name, cell, manifest.AckApplied)
}

// runAgentAcking is runAgent acknowledging with status.
func runAgentAcking(t *testing.T, c *controlclient.Client, edgeID, name string, cell *fakeCell, status string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var active int64
		for {
			if m, err := manifest.Collect(ctx, c.Page, edgeID, 0); err == nil && m.Sequence > active {
				ok := true
				for _, e := range m.Entries {
					if e.Domain != name {
						continue
					}
					data, err := c.Artifact(ctx, e.SHA256)
					doc, derr := domain.Decode(data)
					if err != nil || derr != nil {
						ok = false
						break
					}
					cell.load(doc.TLS.Challenges)
				}
				reason := ""
				if status == manifest.AckRefused {
					reason = "tls acme_challenges: refused by the test"
				}
				if ok && c.Ack(ctx, manifest.Ack{Sequence: m.Sequence, Status: status, Reason: reason, At: time.Now()}) == nil {
					active = m.Sequence
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// certSink stands for the certificate store: it keeps what is put.
type certSink struct {
	mu  sync.Mutex
	got map[string][2][]byte
	put chan string
}

func (s *certSink) PutACME(_ context.Context, name string, chain, key []byte) error {
	s.mu.Lock()
	s.got[name] = [2][]byte{chain, key}
	s.mu.Unlock()
	s.put <- name
	return nil
}

type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

const acmeConfig = `{"hostnames":["%s"],"tls":{"acme":true},"routes":[{"prefix":"/","respond":{"status":200,"body":"ok\n"}}]}`

// TestACMEThroughTheCells issues a certificate for a published domain from
// a real Pebble, its HTTP-01 challenge answered by the domain's (fake)
// cell with what the signed manifest carried.
func TestACMEThroughTheCells(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		const host = "shop.example.com"
		cell := newFakeCell(t)
		ca := pebbletest.Start(t, pebbletest.Options{HTTPPort: cell.port, Hostnames: []string{host}})
		sink := &certSink{got: map[string][2][]byte{}, put: make(chan string, 4)}
		logs := &logBuffer{}
		// As serve configures it: the directory's roots from a CA file.
		caFile := t.TempDir() + "/acme-ca.pem"
		if err := os.WriteFile(caFile, ca.RootsPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		acme, err := controlapi.ACMEConfig(ca.DirectoryURL, "ops@example.com", caFile)
		if err != nil {
			t.Fatal(err)
		}
		acme.Certificates, acme.ApplyTimeout = sink, time.Minute
		e = serveOn(t, e.dsn, e.sealKey, func(o *controlapi.Options) {
			o.Logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(logs), zap.DebugLevel))
			o.ACME = acme
		})
		a := e.createEdge(t, "a")
		c, id, _ := e.enroll(t, a.Token)
		runAgent(t, c, id.EdgeID, host, cell)
		published := time.Now()
		if _, err := e.admin.Publish(ctx(t), host, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(fmt.Sprintf(acmeConfig, host))}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sink.put:
			t.Logf("publish to certificate stored: %v (the agent polls every 50 ms)", time.Since(published).Round(time.Millisecond))
		case <-ctx(t).Done():
			t.Fatalf("no certificate stored: status %+v\npebble:\n%s\nlogs:\n%s", e.srv.ACMEStatus(), ca.Output(), logs.String())
		}
		sink.mu.Lock()
		got := sink.got[host]
		sink.mu.Unlock()
		leaf, err := ca.Verify(ctx(t), got[0], got[1], host)
		if err != nil {
			t.Fatalf("issued certificate: %v", err)
		}
		if cell.askedFor(host) == 0 {
			t.Error("the CA never asked the cell")
		}

		// Revision 2 carried the challenge, revision 3 withdrew it.
		revs := map[int64]int{}
		for rev := int64(1); rev <= 3; rev++ {
			_, data, err := e.st.Revision(ctx(t), host, rev)
			if err != nil {
				t.Fatalf("revision %d: %v", rev, err)
			}
			doc, err := domain.Decode(data)
			if err != nil {
				t.Fatal(err)
			}
			revs[rev] = len(doc.TLS.Challenges)
		}
		if revs[1] != 0 || revs[2] != 1 || revs[3] != 0 {
			t.Errorf("challenges per revision %v, want 0, 1, 0", revs)
		}
		if d, _ := e.st.Domain(ctx(t), host); d.Revision != 3 {
			t.Errorf("current revision %d, want 3", d.Revision)
		}
		st := e.srv.ACMEStatus()
		if len(st) != 1 || st[0].Failures != 0 || st[0].LastSuccess.IsZero() || !st[0].NotAfter.Equal(leaf.NotAfter) {
			t.Errorf("acme status %+v", st)
		}
		// The account key is sealed at rest; no private key is logged.
		if v, err := e.st.Setting(ctx(t), "acme-account-key"); err != nil || strings.Contains(v, "PRIVATE KEY") {
			t.Errorf("account key setting %q (%v): want it sealed", v, err)
		}
		if strings.Contains(logs.String(), "PRIVATE KEY") || strings.Contains(logs.String(), string(got[1][40:100])) {
			t.Error("a private key appears in the logs")
		}
	})
}

// TestACMEWaitsForTheCells: an edge that never applies the revision with
// the challenges fails the order, naming what it waited for, before the CA
// is asked to validate anything.
func TestACMEWaitsForTheCells(t *testing.T) {
	const host = "slow.example.com"
	e := start(t, t.TempDir()+"/control.db")
	cell := newFakeCell(t)
	ca := pebbletest.Start(t, pebbletest.Options{HTTPPort: cell.port, Hostnames: []string{host}})
	sink := &certSink{got: map[string][2][]byte{}, put: make(chan string, 4)}
	e = serveOn(t, e.dsn, e.sealKey, func(o *controlapi.Options) {
		o.ACME = &controlapi.ACMEOptions{DirectoryURL: ca.DirectoryURL, Roots: ca.Roots, Certificates: sink, ApplyTimeout: time.Second}
	})
	a := e.createEdge(t, "a")
	e.enroll(t, a.Token) // enrolled, never polls
	if _, err := e.admin.Publish(ctx(t), host, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(fmt.Sprintf(acmeConfig, host))}); err != nil {
		t.Fatal(err)
	}
	st := poll(t, func(context.Context) ([]acmeStateView, error) { return views(e.srv), nil },
		func(s []acmeStateView) bool { return len(s) == 1 && s[0].Failures > 0 },
		func(s []acmeStateView) string { return fmt.Sprintf("no failure reported: %+v", s) })
	for _, want := range []string{"present challenges", "not applied", "waiting for edge " + a.Edge.ID} {
		if !strings.Contains(st[0].LastError, want) {
			t.Errorf("last error %q lacks %q", st[0].LastError, want)
		}
	}
	if cell.askedFor(host) != 0 {
		t.Error("the CA validated before the cells applied the challenges")
	}
	if d, _ := e.st.Domain(ctx(t), host); d.Revision != 3 {
		t.Errorf("current revision %d, want 3: the challenges withdrawn after the failure", d.Revision)
	}
	select {
	case <-sink.put:
		t.Fatal("a certificate was stored")
	default:
	}
}

type acmeStateView struct {
	Failures  int
	LastError string
}

func views(s *controlapi.Server) []acmeStateView {
	var out []acmeStateView
	for _, st := range s.ACMEStatus() {
		out = append(out, acmeStateView{st.Failures, st.LastError})
	}
	return out
}

// TestACMERefusedRevision: an edge that refuses the revision with the
// challenges fails the order at once with the edge's reason.
func TestACMERefusedRevision(t *testing.T) {
	const host = "refused.example.com"
	e := start(t, t.TempDir()+"/control.db")
	cell := newFakeCell(t)
	ca := pebbletest.Start(t, pebbletest.Options{HTTPPort: cell.port, Hostnames: []string{host}})
	e = serveOn(t, e.dsn, e.sealKey, func(o *controlapi.Options) {
		o.ACME = &controlapi.ACMEOptions{DirectoryURL: ca.DirectoryURL, Roots: ca.Roots,
			Certificates: &certSink{got: map[string][2][]byte{}, put: make(chan string, 4)}, ApplyTimeout: time.Minute}
	})
	a := e.createEdge(t, "a")
	c, id, _ := e.enroll(t, a.Token)
	runAgentAcking(t, c, id.EdgeID, host, cell, manifest.AckRefused)
	if _, err := e.admin.Publish(ctx(t), host, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(fmt.Sprintf(acmeConfig, host))}); err != nil {
		t.Fatal(err)
	}
	st := poll(t, func(context.Context) ([]acmeStateView, error) { return views(e.srv), nil },
		func(s []acmeStateView) bool { return len(s) == 1 && s[0].Failures > 0 },
		func(s []acmeStateView) string { return fmt.Sprintf("no failure reported: %+v", s) })
	if want := "edge " + id.EdgeID + " refused manifest sequence"; !strings.Contains(st[0].LastError, want) ||
		!strings.Contains(st[0].LastError, "refused by the test") {
		t.Errorf("last error %q, want %q with the edge's reason", st[0].LastError, want)
	}
	if cell.askedFor(host) != 0 {
		t.Error("the CA validated a revision the edge refused")
	}
}

func TestACMEConfigRefusals(t *testing.T) {
	dir := t.TempDir()
	notPEM := dir + "/not.pem"
	os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	for _, tc := range []struct {
		name, url, email, ca, want string
	}{
		{"email without directory", "", "ops@example.com", "", "need an acme directory URL"},
		{"plain http", "http://ca.example/dir", "", "", "must be https://"},
		{"two emails", "https://ca.example/dir", "a@example.com,b@example.com", "", "one address"},
		{"missing CA file", "https://ca.example/dir", "", dir + "/absent.pem", "acme CA file"},
		{"CA file not PEM", "https://ca.example/dir", "", notPEM, "no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := controlapi.ACMEConfig(tc.url, tc.email, tc.ca); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	if o, err := controlapi.ACMEConfig("", "", ""); o != nil || err != nil {
		t.Fatalf("no directory: %+v, %v: want ACME off", o, err)
	}
	o, err := controlapi.ACMEConfig("https://ca.example/dir", "ops@example.com", "")
	if err != nil || o.DirectoryURL != "https://ca.example/dir" || o.Email != "ops@example.com" || o.Roots != nil {
		t.Fatalf("%+v, %v", o, err)
	}
}

// TestACMEKeptInTheStore: with no store of its own, what the ACME CA
// issues is kept as the domain's certificate (acme_<domain>, shown like an
// uploaded one) and the domain is published again with its chain.
func TestACMEKeptInTheStore(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		const host = "kept.example.com"
		cell := newFakeCell(t)
		ca := pebbletest.Start(t, pebbletest.Options{HTTPPort: cell.port, Hostnames: []string{host}})
		e = serveOn(t, e.dsn, e.sealKey, func(o *controlapi.Options) {
			o.ACME = &controlapi.ACMEOptions{DirectoryURL: ca.DirectoryURL, Roots: ca.Roots, ApplyTimeout: time.Minute}
		})
		a := e.createEdge(t, "a")
		c, id, _ := e.enroll(t, a.Token)
		runAgent(t, c, id.EdgeID, host, cell)
		if _, err := e.admin.Publish(ctx(t), host, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(fmt.Sprintf(acmeConfig, host))}); err != nil {
			t.Fatal(err)
		}
		var doc domain.Domain
		testutil.Eventually(t, 60*time.Second, func() error {
			d, err := e.st.Domain(ctx(t), host)
			if err != nil {
				return err
			}
			_, data, err := e.st.Revision(ctx(t), host, d.Revision)
			if err != nil {
				return err
			}
			if doc, err = domain.Decode(data); err != nil {
				return err
			}
			if !doc.HasCertificate() {
				return fmt.Errorf("revision %d has no certificate yet (acme: %+v)", d.Revision, e.srv.ACMEStatus())
			}
			return nil
		})
		cv, err := e.admin.Certificate(ctx(t), "acme_kept_example_com")
		if err != nil {
			t.Fatal(err)
		}
		if cv.Fingerprint != doc.TLS.Fingerprint || len(cv.Names) != 1 || cv.Names[0] != host {
			t.Errorf("stored %+v; the domain's fingerprint %s", cv, doc.TLS.Fingerprint)
		}
		if len(doc.TLS.Challenges) != 0 || !doc.TLS.ACME {
			t.Errorf("the republished document: %+v", doc.TLS)
		}
		// An operator's publish of the same document keeps the certificate.
		p, err := e.admin.Publish(ctx(t), host, adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(fmt.Sprintf(acmeConfig, host))})
		if err != nil {
			t.Fatal(err)
		}
		_, data, err := e.st.Revision(ctx(t), host, p.Domain.Revision)
		if err != nil {
			t.Fatal(err)
		}
		if again, err := domain.Decode(data); err != nil || again.TLS.Fingerprint != doc.TLS.Fingerprint {
			t.Errorf("republished by the operator: %v %+v", err, again.TLS)
		}
	})
}
