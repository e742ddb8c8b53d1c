package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"cellvisor/controlapi/adminapi"
)

const (
	reservedPool = "reserved-demo"
	reservedHost = "reserved.cellvisor.test"
	reservedBody = "hello from cellvisor: reserved.cellvisor.test served by cell-03 and cell-04 (reserved-demo)\n"
	// poolDrain is how long a moving domain's source cells keep it after
	// routing switched away from them, for both pools of the demo.
	poolDrain = "2s"
	// moveTick is how often the control API looks at the moves under way;
	// moveReadyWithin bounds a move's wait for its target cells.
	moveTick        = 200 * time.Millisecond
	moveReadyWithin = time.Minute
	// placementWait bounds the whole placement scenario.
	placementWait = 3 * time.Minute
	// trafficEvery is how often the client asks the routing view and then
	// the cell it names during the move.
	trafficEvery = 50 * time.Millisecond
)

// reservedCells are the cells the demo assigns to reservedPool.
var reservedCells = []string{"cell-03", "cell-04"}

// cellAddr is a cell's URL on loopback.
func (e *env) cellAddr(cell string) string {
	return fmt.Sprintf("http://127.0.0.1:%d/", e.cellPort(cell))
}

// cellPort is a cell's HTTP port: cell-NN listens on http_base+NN-1.
func (e *env) cellPort(cell string) int {
	var n int
	_, _ = fmt.Sscanf(cell, "cell-%d", &n)
	return e.o.httpBase + n - 1
}

// placement runs the placement scenario through the admin API and prints
// the CLI line an operator would type for each step: a reserved pool with 2
// replicas on cell-03 and cell-04 serves a domain from both (and cells
// 01/02 do not), then the sample domain moves from shared-default into it
// while a client requests it through the routing view every 50 ms; every
// request must succeed, and the domain must end on the reserved cells at a
// new revision the edge applied.
func (e *env) placement(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, placementWait)
	defer cancel()
	out := e.o.out
	fmt.Fprintf(out, "\nplacement: pool %s with 2 replicas on cell-03 and cell-04, then a move of %s into it\n", reservedPool, demoHost)
	fmt.Fprintf(out, "CTL=\"./bin/cellvisor-control --admin %s --token-file %s\"\n", e.ep.AdminURL, e.tokenRel)

	replicas, drain := 2, poolDrain
	fmt.Fprintf(out, "\n$ $CTL pool create %s --replicas 2 --drain %s\n", reservedPool, poolDrain)
	p, err := e.admin.CreatePoolWith(ctx, adminapi.PoolRequest{Name: reservedPool, Replicas: &replicas, Drain: &drain})
	if err != nil {
		return fmt.Errorf("create pool %s: %w", reservedPool, err)
	}
	fmt.Fprintf(out, "pool %s created: class %s, %d replicas per edge, minimum %d ready cell(s), drain %s\n", p.Name, p.Class, p.Replicas, p.MinReady, p.Drain)
	fmt.Fprintf(out, "$ $CTL pool update shared-default --drain %s   # how long cell-01 keeps a domain moving out\n", poolDrain)
	if p, err = e.admin.UpdatePool(ctx, "shared-default", adminapi.PoolRequest{Drain: &drain}); err != nil {
		return fmt.Errorf("update pool shared-default: %w", err)
	}
	fmt.Fprintf(out, "pool %s updated: drain %s\n", p.Name, p.Drain)
	for _, c := range reservedCells {
		fmt.Fprintf(out, "$ $CTL cell assign %s %s %s\n", e.edgeName, c, reservedPool)
		a, err := e.admin.AssignCell(ctx, e.edgeName, c, reservedPool)
		if err != nil {
			return fmt.Errorf("assign %s to %s: %w", c, reservedPool, err)
		}
		fmt.Fprintf(out, "%s assigned to %s (manifest sequence %d)\n", a.Cell, a.Pool, a.Sequence)
	}
	if err := e.awaitPoolReady(ctx, len(reservedCells)); err != nil {
		return err
	}

	if err := e.publishReserved(ctx); err != nil {
		return err
	}
	return e.move(ctx)
}

// awaitPoolReady waits until the edge reports n ready cells of the
// reserved pool, as `pool show` tells an operator.
func (e *env) awaitPoolReady(ctx context.Context, n int) error {
	fmt.Fprintf(e.o.out, "$ $CTL pool show %s   # until the edge reports both cells ready\n", reservedPool)
	start := time.Now()
	var h adminapi.PoolHealth
	err := poll(ctx, func() error {
		if err := e.agentAlive(); err != nil {
			return err
		}
		p, err := e.admin.Pool(ctx, reservedPool)
		if err != nil {
			return err
		}
		for _, h = range p.Edges {
			if h.EdgeID == e.edgeID && h.Reported && h.Ready == n {
				return nil
			}
		}
		return fmt.Errorf("pool %s on the edge: %+v", reservedPool, p.Edges)
	})
	if err != nil {
		return fmt.Errorf("cells %v never reported ready: %w", reservedCells, err)
	}
	fmt.Fprintf(e.o.out, "%s on %s: cells %s, %d ready (after %s)\n", reservedPool, h.EdgeName, strings.Join(h.Cells, ","), h.Ready, since(start))
	return nil
}

// publishReserved publishes reservedHost to the reserved pool from a file
// in the demo's directory (so the printed line can be run again), checks it
// is placed on both reserved cells, served by both, and by neither of
// cells 01/02.
func (e *env) publishReserved(ctx context.Context) error {
	out := e.o.out
	cfg := domainConfig(reservedHost, reservedBody)
	file := filepath.Join(e.root, reservedHost+".json")
	if err := os.WriteFile(file, cfg, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n$ $CTL domain publish %s --pool %s --file %s\n", reservedHost, reservedPool, relPath(file))
	pub, err := e.admin.Publish(ctx, reservedHost, adminapi.DomainRequest{Pool: reservedPool, Config: cfg})
	if err != nil {
		return fmt.Errorf("publish %s: %w", reservedHost, err)
	}
	// The publish answer names the edges; domain show names the cells.
	d, err := e.admin.Domain(ctx, reservedHost)
	if err != nil {
		return fmt.Errorf("domain %s: %w", reservedHost, err)
	}
	cells := activeCells(d)
	fmt.Fprintf(out, "published %s revision %d to %s, placed on %s\n", reservedHost, pub.Domain.Revision, reservedPool, strings.Join(cells, ", "))
	if !slices.Equal(cells, reservedCells) {
		return fmt.Errorf("%s placed on %v, want %v", reservedHost, cells, reservedCells)
	}
	for _, c := range reservedCells {
		if err := e.awaitCell(ctx, c, reservedHost, reservedBody); err != nil {
			return err
		}
		fmt.Fprintf(out, "$ curl -H 'Host: %s' %s\n%s", reservedHost, e.cellAddr(c), reservedBody)
	}
	// Cells 01/02 are other pools': they do not serve it.
	for _, c := range []string{"cell-01", "cell-02"} {
		code, body, err := fetch(ctx, e.cellAddr(c), reservedHost)
		if err != nil {
			return fmt.Errorf("%s for %s: %w", c, reservedHost, err)
		}
		if code != http.StatusNotFound {
			return fmt.Errorf("%s answers %s with HTTP %d %q, want 404: it is %s's", c, reservedHost, code, strings.TrimSpace(body), reservedPool)
		}
		fmt.Fprintf(out, "$ curl -H 'Host: %s' %s   # %s is not %s's: HTTP %d\n", reservedHost, e.cellAddr(c), c, reservedPool, code)
	}
	return nil
}

// move moves the sample domain into the reserved pool, printing each step
// as the control API records it, while traffic runs through the routing
// view; it checks no request failed and the domain ends on the reserved
// cells at a new revision the edge applied.
func (e *env) move(ctx context.Context) error {
	out := e.o.out
	before, err := e.admin.Domain(ctx, demoHost)
	if err != nil {
		return fmt.Errorf("domain %s: %w", demoHost, err)
	}
	// The routing view names the source cell once the edge reported its port.
	if err := poll(ctx, func() error {
		_, err := e.routed(ctx, demoHost)
		return err
	}); err != nil {
		return fmt.Errorf("routing for %s before the move: %w", demoHost, err)
	}
	fmt.Fprintf(out, "\n%s: pool %s, revision %d, on %s\n", demoHost, before.Pool, before.Revision, strings.Join(activeCells(before), ", "))

	tr := &traffic{host: demoHost, body: e.body, byCell: map[string]int{}}
	tctx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); tr.run(tctx, e) }()
	defer func() { stopTraffic(); wg.Wait() }()
	fmt.Fprintf(out, "a client requests %s every %s through the routing view ($CTL domain routing %s)\n", demoHost, trafficEvery, demoHost)

	fmt.Fprintf(out, "$ $CTL domain move %s --to %s\n", demoHost, reservedPool)
	if _, err := e.admin.Move(ctx, demoHost, reservedPool); err != nil {
		return fmt.Errorf("move %s to %s: %w", demoHost, reservedPool, err)
	}
	fmt.Fprintf(out, "$ $CTL domain show %s   # the steps as they happen\n", demoHost)
	d, err := e.followMove(ctx)
	if err != nil {
		return err
	}
	// The source cell lets it go after the drain interval: cell-01 then
	// answers 404 for it.
	if err := poll(ctx, func() error {
		code, _, err := fetch(ctx, e.cellAddr("cell-01"), demoHost)
		if err == nil && code != http.StatusNotFound {
			err = fmt.Errorf("cell-01 answers HTTP %d", code)
		}
		return err
	}); err != nil {
		return fmt.Errorf("cell-01 still serves %s after the move: %w", demoHost, err)
	}
	// A few more requests through the routing view after the move.
	after := tr.count()
	if err := poll(ctx, func() error {
		if n := tr.count() - after; n < 20 {
			return fmt.Errorf("%d requests after the move", n)
		}
		return e.agentAlive()
	}); err != nil {
		return err
	}
	stopTraffic()
	wg.Wait()

	requests, failures, byCell := tr.result()
	fmt.Fprintf(out, "%d requests through the routing view during the move, %d failed; by cell: %s\n", requests, len(failures), formatCounts(byCell))
	if len(failures) > 0 {
		return fmt.Errorf("%d of %d requests for %s failed during the move; first: %s", len(failures), requests, demoHost, failures[0])
	}
	for _, c := range reservedCells {
		if byCell[c] == 0 {
			return fmt.Errorf("no request reached %s through the routing view (by cell: %s)", c, formatCounts(byCell))
		}
	}
	return e.checkMoved(ctx, before, d)
}

// followMove polls the domain until its move ends, printing every new step
// with its time and its offset from the start of the move.
func (e *env) followMove(ctx context.Context) (adminapi.DomainView, error) {
	var d adminapi.DomainView
	printed := 0
	err := poll(ctx, func() error {
		if err := e.agentAlive(); err != nil {
			return err
		}
		var err error
		if d, err = e.admin.Domain(ctx, demoHost); err != nil {
			return err
		}
		if d.Move == nil {
			return errors.New("no move")
		}
		for _, s := range d.Move.Steps[printed:] {
			fmt.Fprintf(e.o.out, "  %s  +%.2fs  %-10s %s\n", s.At.Local().Format("15:04:05.000"), s.At.Sub(d.Move.StartedAt).Seconds(), s.Step, s.Detail)
		}
		printed = len(d.Move.Steps)
		if d.Move.State == adminapi.MoveWaiting || d.Move.State == adminapi.MoveDraining {
			return fmt.Errorf("move %s, waiting for %s", d.Move.State, d.Move.WaitingFor)
		}
		return nil
	})
	if err != nil {
		return d, fmt.Errorf("move of %s to %s: %w", demoHost, reservedPool, err)
	}
	if d.Move.State != adminapi.MoveDone {
		return d, fmt.Errorf("move of %s to %s ended %s: %s", demoHost, reservedPool, d.Move.State, d.Move.Reason)
	}
	fmt.Fprintf(e.o.out, "move %s → %s: %s in %s\n", d.Move.From, d.Move.To, d.Move.State, d.Move.Steps[len(d.Move.Steps)-1].At.Sub(d.Move.StartedAt).Round(time.Millisecond))
	return d, nil
}

// checkMoved checks the moved domain: in the reserved pool at a new
// revision, placed and routed on both reserved cells, which serve it, and
// applied by the edge.
func (e *env) checkMoved(ctx context.Context, before, d adminapi.DomainView) error {
	if d.Pool != reservedPool || d.Revision <= before.Revision {
		return fmt.Errorf("after the move %s is in %s at revision %d, want %s at a revision after %d", demoHost, d.Pool, d.Revision, reservedPool, before.Revision)
	}
	if cells := activeCells(d); !slices.Equal(cells, reservedCells) {
		return fmt.Errorf("after the move %s is on %v, want %v", demoHost, cells, reservedCells)
	}
	routes, err := e.routed(ctx, demoHost)
	if err != nil {
		return err
	}
	var routed []string
	for _, r := range routes {
		routed = append(routed, r.Cell)
	}
	slices.Sort(routed)
	if !slices.Equal(routed, reservedCells) {
		return fmt.Errorf("after the move routing names %v, want %v", routed, reservedCells)
	}
	for _, c := range reservedCells {
		if err := e.awaitCell(ctx, c, demoHost, e.body); err != nil {
			return err
		}
	}
	var view adminapi.EdgeView
	if err := poll(ctx, func() error {
		var err error
		if view, err = e.admin.Edge(ctx, e.edgeID); err == nil && view.ActiveSequence != view.Sequence {
			err = fmt.Errorf("edge sequence %d, active %d", view.Sequence, view.ActiveSequence)
		}
		return err
	}); err != nil {
		return fmt.Errorf("the edge never applied the moved domain: %w", err)
	}
	fmt.Fprintf(e.o.out, "%s: pool %s, revision %d (was %d in %s), served by %s; edge sequence %d applied\n",
		demoHost, d.Pool, d.Revision, before.Revision, before.Pool, strings.Join(reservedCells, " and "), view.ActiveSequence)
	return nil
}

// awaitCell waits until cell answers body for host.
func (e *env) awaitCell(ctx context.Context, cell, host, body string) error {
	err := poll(ctx, func() error {
		if err := e.agentAlive(); err != nil {
			return err
		}
		got, err := get(ctx, e.cellAddr(cell), host)
		if err == nil && got != body {
			err = fmt.Errorf("got %q", got)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s never served %q for %s: %w", cell, strings.TrimSpace(body), host, err)
	}
	return nil
}

func (e *env) agentAlive() error {
	select {
	case <-e.agent.exited:
		return errAgentExited{e.agent.err}
	default:
		return nil
	}
}

// routed is the routing view's routes for host that have a port; an
// address that is not loopback is refused, never dialled.
func (e *env) routed(ctx context.Context, host string) ([]adminapi.Route, error) {
	v, err := e.admin.Routing(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("routing %s: %w", host, err)
	}
	var rs []adminapi.Route
	for _, r := range v.Routes {
		if ip := net.ParseIP(r.Address); ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("routing %s: route %s@%s is not on loopback", host, r.Cell, r.Address)
		}
		if r.Port != 0 {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("routing %s: no route with a port yet", host)
	}
	return rs, nil
}

// traffic is a client of a domain: it asks the routing view for its cells,
// then requests the domain from one of them, in turn.
type traffic struct {
	host, body string

	mu       sync.Mutex
	requests int
	failures []string
	byCell   map[string]int
}

func (t *traffic) run(ctx context.Context, e *env) {
	tick := time.NewTicker(trafficEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		var cell string
		routes, err := e.routed(ctx, t.host)
		if err == nil {
			r := routes[i%len(routes)]
			cell = r.Cell
			var body string
			if body, err = get(ctx, fmt.Sprintf("http://%s/", net.JoinHostPort(r.Address, fmt.Sprint(r.Port))), t.host); err == nil && body != t.body {
				err = fmt.Errorf("%s answered %q, want %q", cell, body, t.body)
			}
		}
		if ctx.Err() != nil {
			return
		}
		t.mu.Lock()
		t.requests++
		if err != nil {
			t.failures = append(t.failures, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
		} else {
			t.byCell[cell]++
		}
		t.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (t *traffic) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.requests
}

func (t *traffic) result() (int, []string, map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.requests, slices.Clone(t.failures), t.byCell
}

// activeCells are a domain's active cells, sorted.
func activeCells(d adminapi.DomainView) []string {
	var cells []string
	for _, p := range d.Placements {
		if p.Role == "active" {
			cells = append(cells, p.Cell)
		}
	}
	slices.Sort(cells)
	return cells
}

func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }
