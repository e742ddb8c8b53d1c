package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/cellapi"
	"cellvisor/config"
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/outbound"
	"cellvisor/testkit/corpingest"
	"cellvisor/testkit/testutil"
)

// fleetEdge is one enrolled agent of an egress fleet.
type fleetEdge struct {
	name, org, region string
	id                string
	cfgPath           string
	cfg               config.Agent
	intake            string   // host:port
	port              int      // cell-01's HTTP port
	logs              []string // its agents' log files, one per run (test goroutine only)

	mu      sync.Mutex    // guards proc: the sampler reads it
	proc    *runningAgent // the current run
	refused atomic.Int64  // refused private calls made on its cell
}

// egressFleet is one control API (in this process, over real mutual TLS,
// with a short lease), a corp ingest as every class's destination and the
// enrolled agents, each the built binary with its own identity, state
// directory, ports, cgroup subtree and intake, all on loopback.
type egressFleet struct {
	c      *control
	bin    string
	lease  time.Duration
	ingest *corpingest.Server
	dest   string
	ctlLog string // the control API's log file
	edges  []*fleetEdge
}

type fleetSpec struct{ name, org, region string }

// startControlBinary runs the built cellvisor-control (serve, SQLite in a
// temporary directory, both listeners on free loopback ports, the given
// egress lease) until the test ends, when it is stopped by its pid
// (SIGTERM, then SIGKILL) and reaped. Its log goes to the returned file,
// printed when the test fails.
func startControlBinary(t testing.TB, lease time.Duration) (*control, string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cellvisor-control")
	if err := testutil.GoBuild("../cellvisor-control", bin); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	listen, adminListen := freeAddr(t), freeAddr(t)
	logf, err := os.Create(filepath.Join(t.TempDir(), "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--data", data, "--listen", listen, "--admin-listen", adminListen, "--egress-lease", lease.String())
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no CELLVISOR_CONTROL_* from the environment
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("control API did not exit within 30s of SIGTERM")
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("control API log:\n%s", b)
		}
	})
	c := &control{data: data, listen: listen}
	c.ep.EdgeURL, c.ep.AdminURL = "https://"+listen, "http://"+adminListen
	testutil.Eventually(t, 60*time.Second, func() error {
		tok, err := os.ReadFile(filepath.Join(data, "admin.token"))
		if err != nil {
			return err
		}
		c.ep.AdminToken = strings.TrimSpace(string(tok))
		c.admin = &adminapi.Client{URL: c.ep.AdminURL, Token: c.ep.AdminToken}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c.ep.CA, err = c.admin.CA(ctx)
		return err
	})
	c.stop = func() {}
	return c, logf.Name()
}

const orgA, orgB = "acme", "beta"

var fleetClasses = []string{"metering", "siem_forwarding"}

func newEgressFleet(t testing.TB, lease time.Duration, specs []fleetSpec) *egressFleet {
	t.Helper()
	testutil.RequireRoot(t)
	f := &egressFleet{bin: buildAgent(t), lease: lease, ingest: corpingest.New()}
	f.c, f.ctlLog = startControlBinary(t, lease)
	dest := httptest.NewServer(f.ingest)
	t.Cleanup(dest.Close)
	f.dest = dest.URL + "/ingest"
	for _, class := range fleetClasses {
		if _, err := f.c.admin.SetEgressPolicy(ctxT(t), orgA, class, adminapi.EgressPolicyRequest{Destination: f.dest, Region: "eu"}); err != nil {
			t.Fatal(err)
		}
	}
	f.c.publish(t, "v1")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, []byte(f.c.ep.CA), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		e := &fleetEdge{name: s.name, org: s.org, region: s.region, intake: freeAddr(t)}
		e.cfgPath, e.cfg = agentConfig(t, 1, fmt.Sprintf("source:\n  poll_interval: 200ms\n  max_backoff: 400ms\n  status_interval: 500ms\n"+
			"egress:\n  intake_listen: %s\n  interval: 300ms\n  max_renew: 1s\n  probe_timeout: 500ms\n  send_timeout: 2s\n", e.intake))
		region := s.region
		created, err := f.c.admin.CreateEdge(ctxT(t), adminapi.EdgeRequest{Name: s.name, Org: s.org, Country: "NL", Continent: "EU", Slots: 1,
			EdgeUpdateRequest: adminapi.EdgeUpdateRequest{Region: &region}})
		if err != nil {
			t.Fatal(err)
		}
		if out, err := runCLI(t, f.bin, "--config", e.cfgPath, "enroll", "--control", f.c.ep.EdgeURL, "--token", created.Token, "--ca-file", caFile); err != nil {
			t.Fatalf("enroll %s: %v\n%s", s.name, err, out)
		}
		e.id = created.Edge.ID
		f.edges = append(f.edges, e)
	}
	for _, e := range f.edges {
		f.start(t, e)
	}
	return f
}

func (f *egressFleet) start(t testing.TB, e *fleetEdge) {
	t.Helper()
	a, st := startAgent(t, f.bin, e.cfgPath, e.cfg)
	if e.port == 0 {
		e.port = st.Slots[0].HTTPPort // fixed by the config: the load reads it
	}
	e.mu.Lock()
	e.proc = a
	e.mu.Unlock()
	e.logs = append(e.logs, a.log)
}

func (f *egressFleet) byID(id string) *fleetEdge {
	for _, e := range f.edges {
		if e.id == id {
			return e
		}
	}
	return nil
}

// agent is e's current run.
func (e *fleetEdge) agent() *runningAgent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.proc
}

func (f *egressFleet) alive(e *fleetEdge) bool {
	select {
	case <-e.agent().exited:
		return false
	default:
		return true
	}
}

// lease is the control API's current lease of (org, class), if any.
func (f *egressFleet) current(t testing.TB, org, class string) (adminapi.LeaseView, bool) {
	t.Helper()
	ls, err := f.c.admin.Leases(ctxT(t), org)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Class == class && !l.Expired {
			return l, true
		}
	}
	return adminapi.LeaseView{}, false
}

// awaitHolder waits until the current lease of (org A, class) is held, at
// an epoch above after, by an edge ok accepts, and that edge's own route
// says so; it fails at once if ever is false for a holder seen meanwhile.
func (f *egressFleet) awaitHolder(t testing.TB, class string, after int64, ok func(*fleetEdge) bool, ever func(*fleetEdge) error) (*fleetEdge, adminapi.LeaseView) {
	t.Helper()
	var holder *fleetEdge
	var lv adminapi.LeaseView
	testutil.Eventually(t, 30*time.Second, func() error {
		l, found := f.current(t, orgA, class)
		if !found {
			return fmt.Errorf("%s: no current lease", class)
		}
		h := f.byID(l.Holder)
		if h == nil {
			t.Fatalf("%s lease held by %s, not an edge of the fleet", class, l.Holder)
		}
		if ever != nil {
			if err := ever(h); err != nil {
				t.Fatalf("%s lease %+v: %v", class, l, err)
			}
		}
		if l.Epoch <= after || !ok(h) {
			return fmt.Errorf("%s lease %+v: not the one awaited yet", class, l)
		}
		if r := egressRoute(t, h.cfg, class); r.Route != edgeapi.RouteDirect || r.Epoch != l.Epoch {
			return fmt.Errorf("%s holder %s's route %+v: want direct at epoch %d", class, h.name, r, l.Epoch)
		}
		holder, lv = h, l
		return nil
	})
	return holder, lv
}

// awaitSettled waits until every running agent of org A routes class to
// the current holder: direct on it, proxy to it on the others.
func (f *egressFleet) awaitSettled(t testing.TB, class string) *fleetEdge {
	t.Helper()
	var holder *fleetEdge
	testutil.Eventually(t, 30*time.Second, func() error {
		l, found := f.current(t, orgA, class)
		if !found {
			return fmt.Errorf("%s: no current lease", class)
		}
		holder = f.byID(l.Holder)
		for _, e := range f.edges {
			if e.org != orgA || !f.alive(e) {
				continue
			}
			r := egressRoute(t, e.cfg, class)
			want := edgeapi.RouteProxy
			if e == holder {
				want = edgeapi.RouteDirect
			}
			if r.Route != want || r.Holder != l.Holder || r.Epoch != l.Epoch {
				return fmt.Errorf("%s on %s: route %+v, want %s to %s at epoch %d", class, e.name, r, want, l.Holder, l.Epoch)
			}
		}
		return nil
	})
	return holder
}

// load makes requests and refused private calls on the cells of org A's
// edges until the returned stop is called (each cell keeps counting while
// its agent is down; the next agent reports it).
func (f *egressFleet) load(t testing.TB) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, e := range f.edges {
		if e.org != orgA {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := cellapi.New(filepath.Join(e.cfg.RunDir, "cell-01", "private.sock"), []byte("not the cell's secret, not at all"))
			for i := 0; ctx.Err() == nil; i++ {
				appBody(e.port)
				if i%3 == 0 {
					cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
					if _, err := cl.Status(cctx); errors.Is(err, cellapi.ErrUnauthorized) {
						e.refused.Add(1)
					}
					ccancel()
				}
				select {
				case <-ctx.Done():
				case <-time.After(60 * time.Millisecond):
				}
			}
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// sampler checks, every few tens of milliseconds while it runs, that each
// class of org A has at most one current lease and that no two agents
// believe they hold one class at the same epoch, and that an agent that
// believes it holds the current epoch is the lease's holder.
type sampler struct {
	f       *egressFleet
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex // guards the following fields
	samples int
	errs    []string
	holders map[string]map[string]bool // class → edge ids seen holding
	// holderOK, when set, judges every holder seen.
	holderOK func(*fleetEdge) error
}

func (f *egressFleet) sample(t testing.TB) *sampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sampler{f: f, cancel: cancel, done: make(chan struct{}), holders: map[string]map[string]bool{}}
	for _, c := range fleetClasses {
		s.holders[c] = map[string]bool{}
	}
	go s.run(ctx)
	t.Cleanup(s.stop)
	return s
}

func (s *sampler) stop() {
	s.cancel()
	<-s.done
}

func (s *sampler) fail(format string, args ...any) {
	s.mu.Lock()
	s.errs = append(s.errs, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *sampler) run(ctx context.Context) {
	defer close(s.done)
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ls, err := s.f.c.admin.Leases(cctx, orgA)
		cancel()
		if err != nil {
			continue
		}
		current := map[string]adminapi.LeaseView{}
		for _, l := range ls {
			if l.Expired {
				continue
			}
			if prev, dup := current[l.Class]; dup {
				s.fail("two current leases of %s: %+v and %+v", l.Class, prev, l)
			}
			current[l.Class] = l
			s.mu.Lock()
			s.holders[l.Class][l.Holder] = true
			ok := s.holderOK
			s.mu.Unlock()
			if h := s.f.byID(l.Holder); ok != nil && h != nil {
				if err := ok(h); err != nil {
					s.fail("%s: %v", l.Class, err)
				}
			}
		}
		believers := map[string]map[int64]string{}
		for _, e := range s.f.edges {
			if e.org != orgA || !s.f.alive(e) {
				continue
			}
			for _, r := range routesOf(ctx, e.cfg) {
				if r.Route != edgeapi.RouteDirect || r.Epoch < 1 {
					continue
				}
				if believers[r.Class] == nil {
					believers[r.Class] = map[int64]string{}
				}
				if other, dup := believers[r.Class][r.Epoch]; dup {
					s.fail("%s and %s both hold %s at epoch %d", other, e.name, r.Class, r.Epoch)
				}
				believers[r.Class][r.Epoch] = e.name
				if l, ok := current[r.Class]; ok && l.Epoch == r.Epoch && l.Holder != e.id {
					s.fail("%s believes it holds %s at the current epoch %d, held by %s", e.name, r.Class, r.Epoch, l.Holder)
				}
			}
		}
		s.mu.Lock()
		s.samples++
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func (s *sampler) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) > 0 {
		t.Fatalf("ownership violated in %d of %d samples:\n%s", len(s.errs), s.samples, strings.Join(s.errs, "\n"))
	}
	if s.samples < 10 {
		t.Fatalf("only %d ownership samples taken", s.samples)
	}
}

// routesOf is an agent's route table, or nil while it does not answer.
func routesOf(ctx context.Context, cfg config.Agent) []edgeapi.RouteStatus {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := adminsock.FetchStatus(ctx, agent.AdminSocket(cfg))
	if err != nil || st.Egress == nil {
		return nil
	}
	return st.Egress.Routes
}

// peerClient is a forwarder with e's enrollment identity, trusting only an
// intake whose certificate names holder.
func peerClient(t *testing.T, e *fleetEdge, holder string) *http.Client {
	t.Helper()
	dir := e.cfg.IdentityDir()
	ptls, err := outbound.NewPeerTLS(filepath.Join(dir, controlclient.CertFile), filepath.Join(dir, controlclient.KeyFile), filepath.Join(dir, controlclient.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: ptls.ClientConfig(holder)}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// forward posts a bundle of from's (of org, as from's own) to to's intake
// and returns the status and the refusal's reason (0 and the error when
// it got no answer).
func forward(ctx context.Context, hc *http.Client, from *fleetEdge, org string, to *fleetEdge, class string) (int, string) {
	id := make([]byte, 16)
	rand.Read(id)
	b := edgeapi.Bundle{ID: hex.EncodeToString(id), Org: org, Class: class, Origin: from.id, CreatedAt: time.Now().UTC(), Items: json.RawMessage(`[]`)}
	data, _ := json.Marshal(b)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+to.intake+edgeapi.PathIntake+class, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Sprintf("forward from %s to %s: %v", from.name, to.name, err)
	}
	defer resp.Body.Close()
	var fr edgeapi.FenceRefusal
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	json.Unmarshal(body, &fr)
	return resp.StatusCode, fr.Reason
}

// elect asks the control API as e (its enrollment identity) who owns class.
func (f *egressFleet) elect(t *testing.T, e *fleetEdge, class string, reachable bool) edgeapi.ElectResponse {
	t.Helper()
	dir := e.cfg.IdentityDir()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, controlclient.CertFile), filepath.Join(dir, controlclient.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(f.c.ep.CA))
	if pem, err := os.ReadFile(filepath.Join(dir, "server-ca.pem")); err == nil {
		roots.AppendCertsFromPEM(pem)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots}}
	defer tr.CloseIdleConnections()
	data, _ := json.Marshal(edgeapi.ElectRequest{Class: class, Reachable: reachable})
	req, _ := http.NewRequestWithContext(ctxT(t), http.MethodPost, f.c.ep.EdgeURL+edgeapi.PathEgressElect, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out edgeapi.ElectResponse
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
		t.Fatalf("elect as %s: HTTP %d", e.name, resp.StatusCode)
	}
	return out
}

// journaled lists the bundle ids an agent's log says it journaled (its
// producers' bundles), over every run of it.
func journaled(t *testing.T, logs ...string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, path := range logs {
		fh, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line struct {
				Msg    string `json:"msg"`
				Bundle string `json:"bundle"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "bundle journaled" {
				out[line.Bundle] = true
			}
		}
		fh.Close()
	}
	return out
}

// trail is every log line of the edges' agents that names bundle id, by
// edge and run: where a bundle went.
func trail(edges []*fleetEdge, id string) string {
	var b strings.Builder
	for _, e := range edges {
		for run, path := range e.logs {
			data, _ := os.ReadFile(path)
			for line := range strings.Lines(string(data)) {
				if strings.Contains(line, id) {
					fmt.Fprintf(&b, "  %s run %d: %s", e.name, run+1, line)
				}
			}
		}
	}
	return b.String()
}

func sendSignal(t testing.TB, e *fleetEdge, sig syscall.Signal) {
	t.Helper()
	if err := e.agent().cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s %s: %v", sig, e.name, err)
	}
}

// Governed egress across real agents: four of org A in two regions (the
// policies prefer eu) and one of org B, one control API with a 2 s lease,
// a corp ingest as the destination. Exactly one owner per (org, class) at
// every sample; intakes refuse non-holders' and other orgs' forwards;
// killing the in-region holder promotes the next in-region survivor (peers
// fall back to direct meanwhile), freezing one past its lease fences it
// out, and only with no in-region survivor does the out-of-region edge
// take over; over the run every bundle is ingested, none lost.
func TestEgressFleet(t *testing.T) {
	f := newEgressFleet(t, 2*time.Second, []fleetSpec{
		{"eu-1", orgA, "eu"}, {"eu-2", orgA, "eu"}, {"eu-3", orgA, "eu"}, {"us-1", orgA, "us"}, {"beta-1", orgB, "eu"}})
	us, beta := f.edges[3], f.edges[4]
	var euGone atomic.Bool
	inRegion := func(e *fleetEdge) bool { return e.region == "eu" }
	neverOut := func(e *fleetEdge) error {
		if e.region != "eu" && !euGone.Load() {
			return fmt.Errorf("out-of-region %s holds while an in-region edge lives", e.name)
		}
		return nil
	}
	stopLoad := f.load(t)
	smp := f.sample(t)
	smp.mu.Lock()
	smp.holderOK = neverOut
	smp.mu.Unlock()

	// Steady: each class held in region, every agent routes to its holder,
	// and forwarded bundles arrive under the holder's epoch.
	holders := map[string]*fleetEdge{}
	for _, class := range fleetClasses {
		f.awaitHolder(t, class, 0, inRegion, neverOut)
		holders[class] = f.awaitSettled(t, class)
	}
	t.Logf("holders: metering %s, siem_forwarding %s", holders["metering"].name, holders["siem_forwarding"].name)
	for _, class := range fleetClasses {
		h := holders[class]
		testutil.Eventually(t, 30*time.Second, func() error {
			for _, d := range f.ingest.Deliveries() {
				if b, _ := f.ingest.Bundle(d.Bundle); d.Class == class && d.Sender == h.id && d.Epoch > 0 && b.Origin != h.id {
					return nil
				}
			}
			return fmt.Errorf("no %s bundle forwarded to %s delivered under its epoch yet", class, h.name)
		})
	}

	// Intakes: a non-holder refuses; the holder refuses org B's edge, with
	// its own org's bundle and with a forged one.
	mh := holders["metering"]
	var non *fleetEdge
	for _, e := range f.edges[:3] {
		if e != mh {
			non = e
			break
		}
	}
	if code, reason := forward(ctxT(t), peerClient(t, us, non.id), us, orgA, non, "metering"); code != http.StatusConflict || !strings.Contains(reason, "does not hold") {
		t.Fatalf("non-holder %s's intake answered %d %q, want 409: does not hold the lease", non.name, code, reason)
	}
	// Org B's edge is refused by the fence's peer check before its body is
	// read (issue 32 §2), with its own org's bundle and with a forged one
	// (then without asking the control API again). On a loaded machine the
	// holder's lease may lapse and be taken again between renewals (a new
	// epoch, refused as such): ask until the peer is what the fence judges.
	testutil.Eventually(t, 30*time.Second, func() error {
		code, reason := forward(ctxT(t), peerClient(t, beta, mh.id), beta, orgB, mh, "metering")
		switch {
		case code != http.StatusForbidden:
			t.Fatalf("holder's intake to org B's bundle: %d %q, want 403 (%s)", code, reason, egressFencePeerNotInOrg)
		case !strings.Contains(reason, egressFencePeerNotInOrg):
			return fmt.Errorf("org B's forward refused for another reason: %s", reason)
		}
		return nil
	})
	testutil.Eventually(t, 30*time.Second, func() error {
		code, reason := forward(ctxT(t), peerClient(t, beta, mh.id), beta, orgA, mh, "metering")
		switch {
		case code == http.StatusConflict:
			return fmt.Errorf("forged forward refused for another reason: %d %s", code, reason)
		case code != http.StatusForbidden:
			t.Fatalf("holder's intake to org B's edge with a forged org: %d %q, want 403 (%s)", code, reason, egressFencePeerNotInOrg)
		case !strings.Contains(reason, egressFencePeerNotInOrg):
			return fmt.Errorf("forged forward refused for another reason: %s", reason)
		}
		return nil
	})

	// Kill the in-region holder: the next in-region survivor takes over
	// after the expiry, and peers that forwarded to the dead holder
	// meanwhile sent direct.
	_, l1 := f.awaitHolder(t, "metering", 0, inRegion, neverOut)
	mh.agent().kill9(t)
	h2, l2 := f.awaitHolder(t, "metering", l1.Epoch, func(e *fleetEdge) bool { return e != mh && inRegion(e) }, neverOut)
	t.Logf("metering: %s (epoch %d) killed, %s took over at epoch %d", mh.name, l1.Epoch, h2.name, l2.Epoch)
	testutil.Eventually(t, 30*time.Second, func() error {
		for _, d := range f.ingest.Deliveries() {
			if d.Class == "metering" && d.Epoch == 0 && d.Sender != mh.id {
				return nil
			}
		}
		return errors.New("no metering bundle sent direct by a peer of the dead holder")
	})
	fallback := int64(0)
	for _, e := range f.edges[:4] {
		if f.alive(e) {
			fallback += egressRoute(t, e.cfg, "metering").Fallback
		}
	}
	if fallback == 0 {
		t.Fatal("no agent counts a fallback send in its status")
	}

	// Freeze the new holder past its lease: the last in-region edge takes
	// over; resumed, the frozen one's intake refuses, and it never commits
	// under its stale epoch once the successor's began.
	sendSignal(t, h2, syscall.SIGSTOP)
	h3, l3 := f.awaitHolder(t, "metering", l2.Epoch, func(e *fleetEdge) bool { return e != h2 && inRegion(e) }, neverOut)
	t.Logf("metering: %s (epoch %d) frozen, %s took over at epoch %d", h2.name, l2.Epoch, h3.name, l3.Epoch)
	type answer struct {
		code   int
		reason string
	}
	got := make(chan answer, 1)
	hc := peerClient(t, h3, h2.id)
	go func() {
		code, reason := forward(ctxT(t), hc, h3, orgA, h2, "metering")
		got <- answer{code, reason}
	}()
	sendSignal(t, h2, syscall.SIGCONT)
	select {
	case a := <-got:
		if a.code != http.StatusConflict {
			t.Fatalf("resumed holder %s's intake answered %d %q, want 409", h2.name, a.code, a.reason)
		}
		t.Logf("resumed holder's intake: 409 %s", a.reason)
		if strings.Contains(a.reason, "fence refused") {
			// It asked the control API at its stale epoch, which said no.
			testutil.Eventually(t, 10*time.Second, func() error {
				b, _ := os.ReadFile(f.ctlLog)
				for _, line := range strings.Split(string(b), "\n") {
					if strings.Contains(line, `"msg":"egress fence refused"`) && strings.Contains(line, `"edge":"`+h2.id+`"`) &&
						strings.Contains(line, fmt.Sprintf(`"epoch":%d`, l2.Epoch)) {
						return nil
					}
				}
				return fmt.Errorf("the control API's log has no refused fence of %s at epoch %d", h2.name, l2.Epoch)
			})
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the resumed holder's intake did not answer within 30s")
	}
	f.awaitSettled(t, "metering")
	if r := egressRoute(t, h2.cfg, "metering"); r.Route != edgeapi.RouteProxy || r.Holder != h3.id {
		t.Fatalf("resumed %s's route %+v: want proxy to %s", h2.name, r, h3.name)
	}

	// No in-region survivor: the out-of-region edge takes over both classes.
	euGone.Store(true)
	for _, e := range f.edges[:3] {
		if f.alive(e) {
			e.agent().kill9(t)
		}
	}
	for _, class := range fleetClasses {
		f.awaitHolder(t, class, 0, func(e *fleetEdge) bool { return e == us }, nil)
	}

	// Every bundle once: the eu agents start again (they deliver what they
	// journaled and take their classes back); with the load stopped, every
	// journal drains, and every bundle any agent journaled is ingested.
	stopLoad()
	for _, e := range f.edges[:3] {
		f.start(t, e)
	}
	for _, class := range fleetClasses {
		f.awaitHolder(t, class, 0, inRegion, nil)
		f.awaitSettled(t, class)
	}
	testutil.Eventually(t, 60*time.Second, func() error {
		for _, e := range f.edges[:4] {
			for _, r := range egressRoute2(t, e.cfg) {
				if r.Pending != 0 {
					return fmt.Errorf("%s: %s has %d bundles pending", e.name, r.Class, r.Pending)
				}
			}
		}
		return nil
	})
	smp.stop()
	smp.check(t)

	produced := map[string]bool{}
	for _, e := range f.edges[:4] {
		for id := range journaled(t, e.logs...) {
			produced[id] = true
		}
	}
	ingested := f.ingest.IDs()
	lost := 0
	for id := range produced {
		if !ingested[id] {
			lost++
		}
	}
	unlogged := 0
	for id := range ingested {
		if produced[id] {
			continue
		}
		// An agent killed between journaling a bundle and logging it
		// leaves it unlogged; its next run delivers it. It must still be
		// one of org A's own.
		if b, _ := f.ingest.Bundle(id); b.Org != orgA || f.byID(b.Origin) == nil || f.byID(b.Origin).org != orgA {
			t.Errorf("bundle %s (%s from %s) ingested but journaled by no edge of %s", id, b.Org, b.Origin, orgA)
		}
		unlogged++
	}
	tot := f.ingest.Total()
	t.Logf("bundles: %d journaled by the agents (%d more unlogged: killed before the log line), %d ingested, %d lost, %d deliveries (%d duplicates, harmless)",
		len(produced), unlogged, len(ingested), lost, tot.Received, tot.Duplicate)
	if lost != 0 || len(produced) == 0 {
		for id := range produced {
			if !ingested[id] {
				t.Logf("lost bundle %s:\n%s", id, trail(f.edges[:4], id))
			}
		}
		t.Fatalf("%d of %d journaled bundles never ingested", lost, len(produced))
	}
	// The cells' last counts become bundles at the agents' next producer
	// interval after the load stopped: await them, bounded.
	testutil.Eventually(t, 30*time.Second, func() error {
		ids := f.ingest.IDs()
		for _, e := range f.edges[:4] {
			var n float64
			for id := range ids {
				b, _ := f.ingest.Bundle(id)
				if b.Class != "siem_forwarding" || b.Origin != e.id {
					continue
				}
				var items []map[string]any
				json.Unmarshal(b.Items, &items)
				for _, it := range items {
					n += it["count"].(float64)
				}
			}
			if want := e.refused.Load(); int64(n) < want || want == 0 {
				return fmt.Errorf("%s: security events ingested count %v refused calls, %d were made", e.name, n, want)
			}
		}
		return nil
	})
	checkEpochOrder(t, f.ingest.Deliveries())
}

// egressFencePeerNotInOrg is the fence's refusal of another org's edge.
const egressFencePeerNotInOrg = "peer_not_in_org"

// egressRoute2 is an agent's whole route table.
func egressRoute2(t *testing.T, cfg config.Agent) []edgeapi.RouteStatus {
	t.Helper()
	rs := routesOf(context.Background(), cfg)
	if rs == nil {
		t.Fatalf("no route table from %s", cfg.StateDir)
	}
	return rs
}

// checkEpochOrder fails when a bundle was committed under an epoch after a
// delivery under a higher epoch of its class had arrived: two believers
// committing at once. Epoch 0 (fallback sends by non-holders) is outside
// the lease.
func checkEpochOrder(t *testing.T, ds []corpingest.Delivery) {
	t.Helper()
	high := map[string]corpingest.Delivery{}
	for _, d := range ds {
		if d.Epoch == 0 {
			continue
		}
		if h, ok := high[d.Class]; ok && d.Epoch < h.Epoch {
			t.Errorf("%s bundle %s committed by %s under epoch %d at %s, after %s's epoch %d began at %s",
				d.Class, d.Bundle, d.Sender, d.Epoch, d.At.Format(time.StampMicro), h.Sender, h.Epoch, h.At.Format(time.StampMicro))
		}
		if d.Epoch > high[d.Class].Epoch {
			high[d.Class] = d
		}
	}
}

// The cascade's refusals, through a real agent and the real control API:
// a hard requirement no live edge meets, and a destination no edge can
// reach (a closed loopback port), each with its stage and reason in the
// elect answer and in `cellvisor status`; the bundles stay journaled. (An
// empty candidate set cannot come from an enrolled agent's own call: the
// caller is always a live member; the egress package's table test covers
// it.)
func TestEgressRefusals(t *testing.T) {
	f := newEgressFleet(t, 2*time.Second, []fleetSpec{{"beta-1", orgB, "eu"}})
	e := f.edges[0]
	closed := "http://" + freeAddr(t) + "/ingest" // nothing listens there
	if _, err := f.c.admin.SetEgressPolicy(ctxT(t), orgB, "metering", adminapi.EgressPolicyRequest{Destination: f.dest, Region: "eu",
		Require: edgeapi.Requirement{Region: "mars"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.admin.SetEgressPolicy(ctxT(t), orgB, "siem_forwarding", adminapi.EgressPolicyRequest{Destination: closed, Region: "eu"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		class, stage, reason string
		reachable            bool
	}{
		{"metering", edgeapi.StageLiveResolve, "hard_requirement_unmet", true},
		{"siem_forwarding", edgeapi.StageNoBlackHole, "no_reachable_candidate", false},
	} {
		testutil.Eventually(t, 30*time.Second, func() error {
			if r := egressRoute(t, e.cfg, tc.class); r.Route != edgeapi.RouteRefused || r.Stage != tc.stage || r.Reason != tc.reason {
				return fmt.Errorf("%s route %+v: want refused at %s: %s", tc.class, r, tc.stage, tc.reason)
			}
			return nil
		})
		// Asked as the edge, with what its own probe finds.
		if a := f.elect(t, e, tc.class, tc.reachable); a.Outcome != edgeapi.OutcomeRefused || a.Stage != tc.stage || a.Reason != tc.reason || a.Holder != nil {
			t.Fatalf("elect %s as %s: %+v, want refused at %s: %s", tc.class, e.name, a, tc.stage, tc.reason)
		}
		out, err := runCLI(t, f.bin, "--config", e.cfgPath, "status")
		if err != nil || !regexpLine(out, tc.class+`\s+refused\s+.*refused at `+tc.stage+`: `+tc.reason) {
			t.Fatalf("status: %v\n%s\nwant %s refused at %s: %s", err, out, tc.class, tc.stage, tc.reason)
		}
	}
	// Refused classes keep their bundles journaled, and nothing reached
	// the destination.
	badPrivateCalls(t, e.cfg.RunDir, 2)
	testutil.Eventually(t, 30*time.Second, func() error {
		if r := egressRoute(t, e.cfg, "siem_forwarding"); r.Pending < 1 {
			return fmt.Errorf("no security bundle journaled: %+v", r)
		}
		return nil
	})
	if n := f.ingest.Total().Received; n != 0 {
		t.Fatalf("%d deliveries while every class is refused", n)
	}
}

// BenchmarkEgressFailover measures a failover with a 2 s lease: from the
// SIGKILL of the metering holder (one of three agents of org A in eu, on
// real cells, the built control API) to the first bundle committed at the
// destination under a newer epoch, by the ingest's clock. Reported as
// seconds and as a ratio to the lease (target under 1.5). The killed agent
// starts again between rounds, off the clock.
func BenchmarkEgressFailover(b *testing.B) {
	const lease = 2 * time.Second
	f := newEgressFleet(b, lease, []fleetSpec{{"eu-1", orgA, "eu"}, {"eu-2", orgA, "eu"}, {"eu-3", orgA, "eu"}})
	f.load(b)
	any := func(*fleetEdge) bool { return true }
	var total, worst time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		f.awaitSettled(b, "metering")
		h, l := f.awaitHolder(b, "metering", 0, any, nil)
		b.StartTimer()
		killed := time.Now()
		h.agent().kill9(b)
		var took time.Duration
		testutil.Eventually(b, time.Minute, func() error {
			for _, d := range f.ingest.Deliveries() {
				if d.Class == "metering" && d.Epoch > l.Epoch && d.At.After(killed) {
					took = d.At.Sub(killed)
					return nil
				}
			}
			return fmt.Errorf("no metering bundle under an epoch above %d since %s was killed", l.Epoch, h.name)
		})
		b.StopTimer()
		total, worst = total+took, max(worst, took)
		b.Logf("failover %d: %s killed at epoch %d, first commit under a newer epoch %s later (%.2f× the lease)", i+1, h.name, l.Epoch,
			took.Round(time.Millisecond), took.Seconds()/lease.Seconds())
		f.start(b, h)
		b.StartTimer()
	}
	mean := total.Seconds() / float64(b.N)
	b.ReportMetric(mean, "s/failover")
	b.ReportMetric(mean/lease.Seconds(), "lease-ratio")
	b.ReportMetric(worst.Seconds()/lease.Seconds(), "worst-lease-ratio")
}
