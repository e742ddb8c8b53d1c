package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/config"
	"cellvisor/manifest"
	"cellvisor/runtime"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// pubDomain is one domain of a placement test's manifest.
type pubDomain struct {
	name, pool string
	doc        string   // the artifact's fields after domain, pool, revision and hostnames
	cells      []string // the cells serving it, or none for every cell of its pool
}

// publishPlaced signs and publishes sequence seq with these domains and
// assignments (nil: unchanged).
func (s *spool) publishPlaced(t testing.TB, seq int64, a *manifest.Assignments, domains ...pubDomain) {
	t.Helper()
	m := manifest.Manifest{EdgeID: spoolEdge, Sequence: seq, Assignments: a}
	arts := map[string][]byte{}
	for _, d := range domains {
		art := []byte(fmt.Sprintf(`{"domain":%q,"pool":%q,"revision":%d,"hostnames":[%q],%s}`, d.name, d.pool, seq, d.name, d.doc))
		e := manifest.NewEntry(s.priv, spoolEdge, d.name, d.pool, seq, art)
		if len(d.cells) > 0 {
			e.Cells = d.cells
			e.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(s.priv, manifest.SigningMessage(spoolEdge, e)))
		}
		arts[e.SHA256] = art
		m.Entries = append(m.Entries, e)
	}
	if err := s.src.Publish(manifest.Sign(s.priv, m, nil), arts); err != nil {
		t.Fatal(err)
	}
}

func respond(body string) string {
	return fmt.Sprintf(`"routes":[{"prefix":"/","respond":{"status":200,"body":%q}}]`, body)
}

// get asks a cell on loopback for host/path; it returns the status and body.
func get(port int, host, path string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
	req.Host = host
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req.WithContext(ctx))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func awaitServed(t testing.TB, port int, host, want string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() error {
		code, body, err := get(port, host, "/")
		if err != nil || code != 200 || body != want {
			return fmt.Errorf("%s on port %d: %d %q %v, want %q", host, port, code, body, err, want)
		}
		return nil
	})
}

func slotStatus(t testing.TB, cfg config.Agent, name string) supervisor.SlotStatus {
	t.Helper()
	for _, s := range mustStatus(t, cfg).Slots {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no slot %s", name)
	return supervisor.SlotStatus{}
}

var (
	sharedPolicy   = manifest.PoolPolicy{Class: "shared"}
	reservedPolicy = manifest.PoolPolicy{Class: "reserved"}
)

// Signed assignments reach the real cells: newly assigned cells start with
// their pool's release and serve only their own domains, an unassigned cell
// is drained, stopped and emptied, the untouched cell keeps its master, and
// an offline cold start uses the last signed set.
func TestAssignmentsReachTheCells(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	spoolDir := filepath.Join(t.TempDir(), "spool")
	cfgPath, cfg := agentConfig(t, 4, fmt.Sprintf("source:\n  dir: %s\n  poll_interval: 100ms\n  max_backoff: 500ms\n", spoolDir))
	sp := newSpool(t, cfg, spoolDir)
	app := pubDomain{name: "app.test", pool: "shared-default", doc: respond("app")}
	quar := pubDomain{name: "q.test", pool: "quarantine-default", doc: respond("q")}
	sp.publishPlaced(t, 1, nil, app, quar)
	agent, st := startAgent(t, bin, cfgPath, cfg)
	port := map[string]int{}
	for _, s := range st.Slots {
		port[s.Name] = s.HTTPPort
	}
	awaitServed(t, port["cell-01"], "app.test", "app")
	awaitServed(t, port["cell-02"], "q.test", "q")
	awaitAck(t, sp, 1, manifest.AckApplied)
	pid1 := slotStatus(t, cfg, "cell-01").PID

	asg := &manifest.Assignments{
		Cells: map[string]string{"cell-01": "shared-default", "cell-03": "reserved-eu", "cell-04": "reserved-eu"},
		Pools: map[string]manifest.PoolPolicy{"shared-default": sharedPolicy, "reserved-eu": reservedPolicy},
	}
	both := pubDomain{name: "both.test", pool: "reserved-eu", doc: respond("both")}
	only3 := pubDomain{name: "only3.test", pool: "reserved-eu", doc: respond("only3"), cells: []string{"cell-03"}}
	sp.publishPlaced(t, 2, asg, app, both, only3)
	awaitAck(t, sp, 2, manifest.AckApplied)
	for _, c := range []string{"cell-03", "cell-04"} {
		if s := slotStatus(t, cfg, c); s.Assignment != supervisor.Assigned || s.Pool != "reserved-eu" || s.State != supervisor.StateReady {
			t.Errorf("%s: %s %s %s (%s)", c, s.Assignment, s.Pool, s.State, s.Reason)
		}
		awaitServed(t, port[c], "both.test", "both")
	}
	awaitServed(t, port["cell-03"], "only3.test", "only3")
	if code, _, err := get(port["cell-04"], "only3.test", "/"); err != nil || code != 404 {
		t.Errorf("cell-04 answers only3.test with %d %v, want 404: it is cell-03's only", code, err)
	}
	for _, c := range []string{"cell-01", "cell-02"} {
		if code, _, _ := get(port[c], "both.test", "/"); code == 200 {
			t.Errorf("%s serves both.test, a reserved-eu domain", c)
		}
	}
	s2 := slotStatus(t, cfg, "cell-02")
	if s2.Assignment != supervisor.Unassigned || s2.State != supervisor.StateStopped || s2.PID != 0 {
		t.Errorf("cell-02 after unassignment: %s %s pid %d (%s)", s2.Assignment, s2.State, s2.PID, s2.Reason)
	}
	if _, _, err := get(port["cell-02"], "q.test", "/"); err == nil {
		t.Error("cell-02 still answers after unassignment")
	}
	topo := runtime.Plan(runtime.Layout{Slots: 4, HTTPBase: cfg.Ports.HTTPBase, HTTPSBase: cfg.Ports.HTTPSBase, StateDir: cfg.StateDir, RunDir: cfg.RunDir})
	slot2, _ := topo.Slot("cell-02")
	if _, err := runtime.Current(slot2); !errors.Is(err, runtime.ErrNoRelease) {
		t.Errorf("cell-02's runtime is not empty: %v", err)
	}
	if s := slotStatus(t, cfg, "cell-01"); s.PID != pid1 {
		t.Errorf("cell-01 was restarted (pid %d → %d), its content did not change", pid1, s.PID)
	}

	// Offline cold start: the spool is gone, the last signed set is used.
	if err := os.Rename(spoolDir, spoolDir+".away"); err != nil {
		t.Fatal(err)
	}
	agent.stop(t)
	startAgent(t, bin, cfgPath, cfg)
	awaitServed(t, port["cell-03"], "only3.test", "only3")
	awaitServed(t, port["cell-04"], "both.test", "both")
	if s := slotStatus(t, cfg, "cell-02"); s.Assignment != supervisor.Unassigned || s.State != supervisor.StateStopped {
		t.Errorf("cold start: cell-02 %s %s", s.Assignment, s.State)
	}
}

// A cell of a pool with limits refuses past them, 503 over the connection
// limit and 429 over the request rate, and counts each refusal by kind;
// its neighbour, in a pool without limits, serves every request of the
// same flood.
func TestPoolLimitsRefuseAndCount(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	spoolDir := filepath.Join(t.TempDir(), "spool")
	cfgPath, cfg := agentConfig(t, 2, fmt.Sprintf("source:\n  dir: %s\n  poll_interval: 100ms\n  max_backoff: 500ms\n", spoolDir))
	sp := newSpool(t, cfg, spoolDir)

	// A slow origin on loopback that holds requests until released.
	var inFlight atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "slow")
	}))
	t.Cleanup(origin.Close)
	t.Cleanup(done)
	slow := fmt.Sprintf(`"origins":[{"name":"o","url":%q}],"routes":[{"prefix":"/slow","origin":"o"},{"prefix":"/","respond":{"status":200,"body":"fast"}}]`, origin.URL)
	policy := manifest.PoolPolicy{Class: "reserved", MaxConns: 2}
	asg := func(p manifest.PoolPolicy) *manifest.Assignments {
		return &manifest.Assignments{
			Cells: map[string]string{"cell-01": "shared-default", "cell-02": "reserved-eu"},
			Pools: map[string]manifest.PoolPolicy{"shared-default": sharedPolicy, "reserved-eu": p},
		}
	}
	sp.publishPlaced(t, 1, asg(policy),
		pubDomain{name: "free.test", pool: "shared-default", doc: slow},
		pubDomain{name: "limited.test", pool: "reserved-eu", doc: slow})
	_, st := startAgent(t, bin, cfgPath, cfg)
	free, limited := st.Slots[0].HTTPPort, st.Slots[1].HTTPPort
	awaitAck(t, sp, 1, manifest.AckApplied)
	awaitServed(t, limited, "limited.test", "fast")
	awaitServed(t, free, "free.test", "fast")

	// Connections: two requests held at the origin fill the limit; the
	// third is refused with 503. The neighbour takes three held at once.
	hold := func(port int, host string, n int) chan int {
		codes := make(chan int, n)
		for range n {
			go func() {
				code, _, _ := get(port, host, "/slow")
				codes <- code
			}()
		}
		return codes
	}
	held := hold(limited, "limited.test", 2)
	awaitInFlight(t, &inFlight, 2)
	if code, _, err := get(limited, "limited.test", "/"); err != nil || code != 503 {
		t.Errorf("over the connection limit: %d %v, want 503", code, err)
	}
	heldFree := hold(free, "free.test", 3)
	awaitInFlight(t, &inFlight, 5)
	if code, _, err := get(free, "free.test", "/"); err != nil || code != 200 {
		t.Errorf("the neighbour refused a request: %d %v", code, err)
	}
	done()
	for range 2 {
		if c := <-held; c != 200 {
			t.Errorf("a held request ended %d", c)
		}
	}
	for range 3 {
		if c := <-heldFree; c != 200 {
			t.Errorf("a held request on the neighbour ended %d", c)
		}
	}

	// Rate: 5 requests per second with a burst of 2; a bounded loop of 30.
	sp.publishPlaced(t, 2, asg(manifest.PoolPolicy{Class: "reserved", Rate: 5, Burst: 2}),
		pubDomain{name: "free.test", pool: "shared-default", doc: respond("fast")},
		pubDomain{name: "limited.test", pool: "reserved-eu", doc: respond("fast")})
	awaitAck(t, sp, 2, manifest.AckApplied)
	awaitReloaded(t, cfg, "cell-01")
	awaitReloaded(t, cfg, "cell-02")
	var refused429, ok200, other int
	for range 30 {
		code, _, err := get(limited, "limited.test", "/")
		switch {
		case err != nil:
			t.Fatal(err)
		case code == 429:
			refused429++
		case code == 200:
			ok200++
		default:
			other++
		}
		if code, _, err := get(free, "free.test", "/"); err != nil || code != 200 {
			t.Errorf("the neighbour answered %d %v during the flood", code, err)
		}
	}
	if refused429 == 0 || ok200 == 0 || other != 0 {
		t.Errorf("flood of 30: %d refused, %d served, %d other; want both kinds and nothing else", refused429, ok200, other)
	}
	s := slotStatus(t, cfg, "cell-02")
	if s.Cell == nil {
		t.Fatalf("no cell report: %s", s.CellError)
	}
	if s.Cell.Refused.Connections != 1 || s.Cell.Refused.Rate != int64(refused429) {
		t.Errorf("cell-02 counted %+v, want 1 connection refusal and %d rate refusals", s.Cell.Refused, refused429)
	}
	if s.Cell.Limits.Rate != 5 || s.Cell.Limits.Burst != 2 {
		t.Errorf("cell-02 reports limits %+v at sequence %d", s.Cell.Limits, s.Cell.Sequence)
	}
	if n := slotStatus(t, cfg, "cell-01").Cell; n == nil || n.Refused.Connections != 0 || n.Refused.Rate != 0 {
		t.Errorf("the neighbour counted refusals: %+v", n)
	}
	t.Logf("flood of 30 on a 5 r/s, burst 2 cell: %d served, %d refused (429); refusals %+v", ok200, refused429, s.Cell.Refused)
}

func awaitInFlight(t testing.TB, n *atomic.Int64, want int64) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := n.Load(); got != want {
			return fmt.Errorf("%d requests at the origin, want %d", got, want)
		}
		return nil
	})
}

// awaitReloaded waits until the cell's master has one worker: after a
// graceful reload the old worker may still take requests (and answer with
// the old configuration) until it has taken up its shutdown, which a loaded
// machine can delay.
func awaitReloaded(t testing.TB, cfg config.Agent, cell string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() error {
		pid := slotStatus(t, cfg, cell).PID
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if err != nil {
			return err
		}
		// The master's other children are its cache manager and loader,
		// where the cell caches.
		var workers []string
		for _, child := range strings.Fields(string(b)) {
			title, _ := os.ReadFile("/proc/" + child + "/cmdline")
			if strings.Contains(string(title), "worker process") {
				workers = append(workers, strings.TrimRight(string(title), "\x00"))
			}
		}
		if len(workers) != 1 {
			return fmt.Errorf("%s master %d has workers %q", cell, pid, workers)
		}
		return nil
	})
}
