package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/config"
	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/testkit/testutil"
)

// movesEdge is a real control API with a short move tick and a real
// enrolled agent with four cells on loopback.
type movesEdge struct {
	c    *control
	id   string
	port map[string]int
	cfg  config.Agent
}

func startMovesEdge(t *testing.T, readyWithin time.Duration, started func(port map[string]int)) *movesEdge {
	t.Helper()
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	c := startControl(t, t.TempDir(), "127.0.0.1:0", func(cfg *controlapi.Config) {
		cfg.MoveTick, cfg.MoveReadyWithin = 100*time.Millisecond, readyWithin
	})
	cfgPath, cfg := agentConfig(t, 4, "source:\n  poll_interval: 100ms\n  max_backoff: 400ms\n  status_interval: 200ms\n")
	created := c.enroll(t, bin, cfgPath, adminapi.EdgeRequest{Name: "mv", Org: "acme", Country: "NL", Continent: "EU", Slots: 4, MgmtIPv4: "127.0.0.1"})
	e := &movesEdge{c: c, id: created.Edge.ID, port: map[string]int{}, cfg: cfg}
	for i := 1; i <= 4; i++ {
		e.port[fmt.Sprintf("cell-%02d", i)] = cfg.Ports.HTTPBase + i - 1
	}
	// The cells start with a first manifest.
	e.publish(t, "base.test", "shared-default", "base")
	startAgent(t, bin, cfgPath, cfg)
	awaitServed(t, e.port["cell-01"], "base.test", "base")
	if started != nil {
		started(e.port)
	}
	return e
}

func (e *movesEdge) assign(t *testing.T, cell, pool string) {
	t.Helper()
	if _, err := e.c.admin.AssignCell(ctxT(t), e.id, cell, pool); err != nil {
		t.Fatalf("assign %s to %s: %v", cell, pool, err)
	}
}

func (e *movesEdge) pool(t *testing.T, name string, replicas int, drain string) {
	t.Helper()
	zero := 0
	if _, err := e.c.admin.CreatePoolWith(ctxT(t), adminapi.PoolRequest{Name: name, Replicas: &replicas, MinReady: &zero, Drain: &drain}); err != nil {
		t.Fatal(err)
	}
}

func (e *movesEdge) publish(t *testing.T, name, pool, body string) {
	t.Helper()
	if _, err := e.c.admin.Publish(ctxT(t), name, adminapi.DomainRequest{Pool: pool, Config: []byte(
		fmt.Sprintf(`{"hostnames":[%q],%s}`, name, respond(body)))}); err != nil {
		t.Fatal(err)
	}
}

// cells are the domain's cells of a role.
func (e *movesEdge) cells(t *testing.T, name, role string) []string {
	t.Helper()
	d, err := e.c.admin.Domain(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Placements {
		if p.Role == role {
			out = append(out, p.Cell)
		}
	}
	slices.Sort(out)
	return out
}

// awaitMove waits until the domain's move is in state.
func (e *movesEdge) awaitMove(t *testing.T, name, state string, within time.Duration) adminapi.DomainView {
	t.Helper()
	var d adminapi.DomainView
	testutil.Eventually(t, within, func() error {
		var err error
		if d, err = e.c.admin.Domain(ctxT(t), name); err != nil {
			return err
		}
		if d.Move == nil || d.Move.State != state {
			return fmt.Errorf("move of %s: %+v, want %s", name, d.Move, state)
		}
		return nil
	})
	return d
}

// routed asks the routing view, as DNS would, for the domain's cells; only
// loopback is dialled.
func (e *movesEdge) routed(ctx context.Context, name string) ([]int, error) {
	v, err := e.c.admin.Routing(ctx, name)
	if err != nil {
		return nil, err
	}
	var ports []int
	for _, r := range v.Routes {
		if r.Address != "" && !net.ParseIP(r.Address).IsLoopback() {
			return nil, fmt.Errorf("route %+v is not loopback", r)
		}
		if r.Port != 0 {
			ports = append(ports, r.Port)
		}
	}
	if len(ports) == 0 {
		return nil, fmt.Errorf("no routes for %s: %+v", name, v)
	}
	return ports, nil
}

// watch requests host from one cell every 10 ms until stop, noting when it
// first served it and when it first stopped serving it after that.
type watch struct {
	mu      sync.Mutex
	served  time.Time // first 200 with the body
	dropped time.Time // first answer without it after served
}

func (w *watch) run(ctx context.Context, port int, host, body string) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		code, got, err := get(port, host, "/")
		now := time.Now()
		ok := err == nil && code == 200 && got == body
		w.mu.Lock()
		switch {
		case ok && w.served.IsZero():
			w.served = now
		case !ok && !w.served.IsZero() && w.dropped.IsZero():
			w.dropped = now
		}
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (w *watch) times() (served, dropped time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.served, w.dropped
}

// An edge with two pools on four cells: a reserved pool with 2 replicas on
// cell-03 and cell-04 serves its domain from both and from neither of
// cells 01/02; a domain moved from shared-default into it is requested
// every 10 ms through the routing view throughout and never fails; the
// source cell drops it only after the target served it and the drain
// interval passed; entry and artifact name the target pool after.
func TestMoveBetweenPoolsOnRealCells(t *testing.T) {
	e := startMovesEdge(t, 30*time.Second, nil)
	e.pool(t, "reserved-eu", 2, "1s")
	drain := "1s" // the source pool's drain interval
	if _, err := e.c.admin.UpdatePool(ctxT(t), "shared-default", adminapi.PoolRequest{Drain: &drain}); err != nil {
		t.Fatal(err)
	}
	e.assign(t, "cell-02", "shared-default")
	e.assign(t, "cell-03", "reserved-eu")
	e.assign(t, "cell-04", "reserved-eu")

	e.publish(t, "r.test", "reserved-eu", "r")
	if got := e.cells(t, "r.test", "active"); !slices.Equal(got, []string{"cell-03", "cell-04"}) {
		t.Fatalf("r.test placed on %v, want cell-03 and cell-04", got)
	}
	awaitServed(t, e.port["cell-03"], "r.test", "r")
	awaitServed(t, e.port["cell-04"], "r.test", "r")
	for _, c := range []string{"cell-01", "cell-02"} {
		if code, _, err := get(e.port[c], "r.test", "/"); err != nil || code == 200 {
			t.Errorf("%s answers r.test with %d %v: it is reserved-eu's", c, code, err)
		}
	}

	e.publish(t, "app.test", "shared-default", "app")
	src := e.cells(t, "app.test", "active")
	if len(src) != 1 || (src[0] != "cell-01" && src[0] != "cell-02") {
		t.Fatalf("app.test placed on %v", src)
	}
	awaitServed(t, e.port[src[0]], "app.test", "app")
	// The publish reloaded the source cell: its old worker may take a
	// request or two until it has taken up its shutdown (a known window
	// of graceful reloads, apart from the move measured here).
	awaitReloaded(t, e.cfg, src[0])
	testutil.Eventually(t, 30*time.Second, func() error {
		ports, err := e.routed(ctxT(t), "app.test")
		if err == nil && !slices.Equal(ports, []int{e.port[src[0]]}) {
			err = fmt.Errorf("routed to %v", ports)
		}
		return err
	})

	// The client: every 10 ms, ask routing, then the cell it names.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	var mu sync.Mutex
	var failures []string
	requests, byPort := 0, map[int]int{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			ports, err := e.routed(ctx, "app.test")
			var code int
			var body string
			if err == nil {
				code, body, err = get(ports[i%len(ports)], "app.test", "/")
			}
			if ctx.Err() != nil {
				return
			}
			mu.Lock()
			requests++
			if err != nil || code != 200 || body != "app" {
				failures = append(failures, fmt.Sprintf("%s: %d %q %v", time.Now().Format(time.StampMilli), code, body, err))
			} else {
				byPort[ports[i%len(ports)]]++
			}
			mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	watches := map[string]*watch{}
	for _, c := range []string{src[0], "cell-03", "cell-04"} {
		w := &watch{}
		watches[c] = w
		wg.Add(1)
		go func() { defer wg.Done(); w.run(ctx, e.port[c], "app.test", "app") }()
	}

	if _, err := e.c.admin.Move(ctxT(t), "app.test", "reserved-eu"); err != nil {
		t.Fatal(err)
	}
	d := e.awaitMove(t, "app.test", "done", time.Minute)
	// The source dropped it: wait for its watcher to see that.
	testutil.Eventually(t, 30*time.Second, func() error {
		if _, dropped := watches[src[0]].times(); dropped.IsZero() {
			return fmt.Errorf("%s still serves app.test", src[0])
		}
		return nil
	})
	// A few more requests through routing after the move.
	mu.Lock()
	after := requests
	mu.Unlock()
	testutil.Eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if requests < after+20 {
			return fmt.Errorf("%d requests after the move", requests-after)
		}
		return nil
	})
	stop()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed during the move; first: %s", len(failures), requests, failures[0])
	}
	t.Logf("%d requests through the routing view, by port %v", requests, byPort)
	if byPort[e.port["cell-03"]] == 0 || byPort[e.port["cell-04"]] == 0 || byPort[e.port[src[0]]] == 0 {
		t.Errorf("requests by port %v: want the source and both targets", byPort)
	}
	var switched time.Time
	var steps []string
	for _, s := range d.Move.Steps {
		steps = append(steps, s.Step)
		if s.Step == "switched" {
			switched = s.At
		}
	}
	if want := []string{"started", "placed", "delivering", "applied", "switched", "drained"}; !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
	_, dropped := watches[src[0]].times()
	for _, c := range []string{"cell-03", "cell-04"} {
		served, _ := watches[c].times()
		if served.IsZero() || !served.Before(dropped) {
			t.Errorf("%s first served app.test at %v, the source dropped it at %v", c, served, dropped)
		}
	}
	if dropped.Sub(switched) < time.Second {
		t.Errorf("the source dropped app.test %v after the switch, before the 1s drain interval", dropped.Sub(switched))
	}
	// After the move, entry and artifact name the target pool: a new
	// revision, the edge applied it.
	if d.Pool != "reserved-eu" || d.Revision != 2 || !strings.Contains(d.Move.Steps[len(d.Move.Steps)-1].Detail, "revision 2 published for reserved-eu") {
		t.Errorf("after the move: pool %s revision %d, last step %+v", d.Pool, d.Revision, d.Move.Steps[len(d.Move.Steps)-1])
	}
	e.c.awaitEdge(t, e.id, "the last sequence applied", func(v adminapi.EdgeView) bool {
		return v.ActiveSequence == v.Sequence && len(v.Acks) > 0 && v.Acks[0].Status == "applied"
	})
	awaitServed(t, e.port["cell-03"], "app.test", "app")
	awaitServed(t, e.port["cell-04"], "app.test", "app")
}

// A target cell that cannot start (its port is taken) never reports ready:
// the move fails with the reason, the domain stays served from the source
// and routing never changed.
func TestMoveToTargetThatCannotServeFails(t *testing.T) {
	e := startMovesEdge(t, 3*time.Second, func(port map[string]int) {
		held, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port["cell-03"]))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { held.Close() })
	})
	e.pool(t, "reserved-eu", 1, "1s")
	// The domain first: the manifest that assigns cell-03 (which cannot
	// start) is acked only after apply_timeout, and a publish behind it
	// would wait as long.
	e.publish(t, "app.test", "shared-default", "app")
	awaitServed(t, e.port["cell-01"], "app.test", "app")
	e.assign(t, "cell-03", "reserved-eu")
	if _, err := e.c.admin.Move(ctxT(t), "app.test", "reserved-eu"); err != nil {
		t.Fatal(err)
	}
	d := e.awaitMove(t, "app.test", "failed", time.Minute)
	if !strings.Contains(d.Move.Reason, "not ready in time") {
		t.Errorf("move failed with %q, want the target not ready in time", d.Move.Reason)
	}
	if d.Pool != "shared-default" {
		t.Errorf("after the failed move the domain is in %s", d.Pool)
	}
	if got := e.cells(t, "app.test", "active"); !slices.Equal(got, []string{"cell-01"}) {
		t.Errorf("after the failed move app.test is on %v", got)
	}
	ports, err := e.routed(ctxT(t), "app.test")
	if err != nil || !slices.Equal(ports, []int{e.port["cell-01"]}) {
		t.Errorf("routing after the failed move: %v, %v", ports, err)
	}
	awaitServed(t, e.port["cell-01"], "app.test", "app")
	t.Logf("move failed: %s", d.Move.Reason)
}
