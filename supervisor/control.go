package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"cellvisor/cellapi"
	"cellvisor/internal/backoff"
	"cellvisor/runtime"
)

// Control errors, for the admin API to map to answers.
var (
	ErrNoSlot      = errors.New("no such cell")
	ErrNotRunning  = errors.New("cell is not running")
	ErrRateLimited = errors.New("restart refused by the rate limit")
)

// client returns the slot's private-endpoint client.
func (c *slot) client() (*cellapi.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.api == nil {
		secret, err := c.spec.Secret()
		if err != nil {
			return nil, err
		}
		c.api = cellapi.New(c.spec.PrivateSocket(), secret)
	}
	return c.api, nil
}

// closeClient ends a private call still in flight once the cell is gone.
func (c *slot) closeClient() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.api != nil {
		c.api.Close()
	}
}

func (c *slot) running() (pid int, st State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pid, c.state
}

// gracefulStop is the stop of an operator restart: drain, wait for requests
// in flight up to the drain timeout, then stop (SIGQUIT, SIGKILL past what is
// left of the timeout).
func (c *slot) gracefulStop(ctx context.Context, p *proc, why string) {
	drain := c.s.settings().DrainTimeout
	deadline := c.s.clk.Now().Add(drain)
	dctx, cancel := context.WithTimeout(ctx, drain)
	defer cancel()
	if api, err := c.client(); err == nil {
		if _, err := api.Drain(dctx); err != nil {
			c.log.Warn("restart: drain", zap.Error(err))
		}
		c.set(StateDrained, why+": waiting for requests in flight")
		for dctx.Err() == nil {
			st, err := api.Status(dctx)
			if err != nil || st.Connections.InFlight() == 0 {
				break
			}
			_ = backoff.Sleep(dctx, c.s.clk, 10*time.Millisecond)
		}
	}
	c.set(StateDegraded, why+": stopping")
	c.stop(p, max(deadline.Sub(c.s.clk.Now()), 100*time.Millisecond))
}

func (s *Supervisor) slotNamed(name string) (*slot, error) {
	for _, c := range s.slots {
		if c.spec.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrNoSlot, name)
}

// Drain makes a cell stop advertising readiness: the drained state is
// persisted (it survives agent and cell restarts), the cell's readiness probe
// answers 503 from then on, requests in flight complete, and a graceful
// reload closes keep-alive connections after their current request.
func (s *Supervisor) Drain(ctx context.Context, name string) (SlotStatus, error) {
	st, err := s.setDrained(ctx, name, true)
	return st, opErr("drain", name, err)
}

// Undrain reverses Drain.
func (s *Supervisor) Undrain(ctx context.Context, name string) (SlotStatus, error) {
	st, err := s.setDrained(ctx, name, false)
	return st, opErr("undrain", name, err)
}

// opErr names the operation on the cell, once, in a control's error: what
// the admin socket answers and a control task's ack carries.
func opErr(verb, name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %s: %w", verb, name, err)
}

func (s *Supervisor) setDrained(ctx context.Context, name string, drained bool) (SlotStatus, error) {
	c, err := s.slotNamed(name)
	if err != nil {
		return SlotStatus{}, err
	}
	if c.poolName() == "" {
		return SlotStatus{}, fmt.Errorf("%w: %s is unassigned", ErrNotRunning, name)
	}
	c.ctl.Lock()
	defer c.ctl.Unlock()
	verb := map[bool]string{true: "drain", false: "undrain"}[drained]
	pid, _ := c.running()
	// Persist first, so that the agent never believes a state the cell is
	// not in; if the cell then refuses, the persisted state is put back.
	if err := runtime.SetDrained(c.spec, drained); err != nil {
		return SlotStatus{}, err
	}
	if pid != 0 {
		api, err := c.client()
		if err == nil {
			if drained {
				_, err = api.Drain(ctx)
			} else {
				_, err = api.Undrain(ctx)
			}
		}
		if err != nil && !c.cellAgrees(ctx, drained, err) {
			if drained && !cellapi.Answered(err) {
				// A cell that does not answer (hung, stalled) is the one an
				// operator most needs out of rotation: the drain is kept.
				// Status says drained now, the cell comes back drained
				// from its next start (the marker), and the monitor
				// drains it as soon as it answers again.
				c.log.Warn("the cell did not take the drain; it stays drained: out of rotation now, drained when it answers or restarts", zap.Error(err))
			} else {
				if rerr := runtime.SetDrained(c.spec, !drained); rerr != nil {
					c.log.Error("restore drained state", zap.Error(rerr))
				}
				return SlotStatus{}, err
			}
		}
	}
	ev := map[bool]event{true: evDrain, false: evUndrain}[drained]
	c.mu.Lock()
	st, act := next(facts{state: c.state, drained: c.drained, running: pid != 0}, ev)
	c.drained, c.state = drained, st
	c.mu.Unlock()
	if act == actReload {
		// Reload picks up the keepalive include: old workers finish their
		// requests and close keep-alive connections; new ones follow it.
		if err := c.hup(pid); err != nil {
			c.log.Warn("reload after "+verb, zap.Error(err))
		}
	}
	c.log.Info("cell "+verb+"ed", zap.Int("pid", pid))
	return c.status(), nil
}

// cellAgrees tells, after a drain or undrain call failed with callErr,
// whether the cell is nonetheless in the state asked for (the call worked
// and only its answer was lost or unreadable): then the persisted marker,
// the cell and status agree on it. Otherwise the caller puts the marker
// back, which agrees with a cell the call did not reach.
func (c *slot) cellAgrees(ctx context.Context, drained bool, callErr error) bool {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	cs, err := c.cellStatus(sctx)
	if err != nil || cs == nil || cs.Drained != drained {
		return false
	}
	c.log.Warn("the cell took the call though its answer failed", zap.Bool("drained", drained), zap.Error(callErr))
	return true
}

// Restart restarts a running cell gracefully: drain, wait for requests in
// flight up to the drain timeout, stop, start, wait for readiness. The new
// cell keeps the slot's drained state (undrained unless drained before).
// Restarts are rate-limited per cell; a refused one says when the next is
// allowed.
func (s *Supervisor) Restart(ctx context.Context, name string) (SlotStatus, error) {
	st, err := s.restart(ctx, name)
	return st, opErr("restart", name, err)
}

func (s *Supervisor) restart(ctx context.Context, name string) (SlotStatus, error) {
	c, err := s.slotNamed(name)
	if err != nil {
		return SlotStatus{}, err
	}
	c.ctl.Lock()
	defer c.ctl.Unlock()
	if st, act := c.decide(evRestart); act == actRefuse {
		return SlotStatus{}, fmt.Errorf("%w: %s is %s", ErrNotRunning, name, st)
	}
	if err := c.admitRestart(c.s.clk.Now()); err != nil {
		return SlotStatus{}, err
	}
	c.saveCounters()
	req := &restartReq{done: make(chan error, 1)}
	select {
	case c.restartCh <- req:
	case <-ctx.Done():
		return SlotStatus{}, ctx.Err()
	}
	c.log.Info("restart requested")
	select {
	case err := <-req.done:
		return c.status(), err
	case <-ctx.Done():
		return c.status(), fmt.Errorf("still restarting: %w", ctx.Err())
	}
}

// admitRestart applies the rate limit: at most RestartLimit restarts in any
// RestartWindow.
func (c *slot) admitRestart(now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.s.settings()
	window := st.RestartWindow
	kept, retryIn, ok := admit(c.opRestarts, now, st.RestartLimit, window)
	c.opRestarts = kept
	if !ok {
		return fmt.Errorf("%w: %s had %d restarts in the last %s; the next is allowed in %s",
			ErrRateLimited, c.spec.Name, len(kept), window, retryIn.Round(time.Second))
	}
	c.opRestartsTotal++
	return nil
}

// Reload makes a cell load its switched release: a graceful reload (SIGHUP)
// of a running cell, or the first start of one that waited for a release.
func (s *Supervisor) Reload(name string) error {
	c, err := s.slotNamed(name)
	if err != nil {
		return err
	}
	meta, err := runtime.Current(c.spec)
	if err != nil {
		return fmt.Errorf("reload %s: %w", name, err)
	}
	c.mu.Lock()
	c.switchToLocked(meta.Sequence)
	pid, answered := c.pid, c.answered
	if pid != 0 && !answered {
		// A master that has not answered its readiness probe yet may not
		// have installed nginx's signal handlers: a SIGHUP then kills it
		// ("killed by signal hangup"). The reload is sent once it answers
		// (onReady).
		c.reloadPending = true
	}
	c.mu.Unlock()
	select {
	case c.released <- struct{}{}:
	default:
	}
	if pid != 0 && answered {
		if n, ok := c.reloadRoom(pid); !ok && c.s.settings().Liveness.Interval >= 0 {
			// Each generation holds a worker, its memory and its
			// connections until worker_shutdown_timeout: a burst of reloads
			// would fill the cell's PIDs and memory with them. This one
			// waits until the last has taken effect and fewer than
			// maxOldGenerations are finishing (retryReload, at each
			// liveness check and each Loaded); reloads asked for
			// meanwhile make one.
			c.mu.Lock()
			c.reloadPending = true
			c.mu.Unlock()
			c.log.Info("reload deferred: older worker generations are still finishing their requests", zap.Int("old_workers", n))
			return nil
		}
		return c.hup(pid)
	}
	return nil
}

// maxOldGenerations is how many generations of workers a reload may leave
// finishing their requests at once.
const maxOldGenerations = 2

// reloadRoom tells whether master pid may be reloaded now: its last
// reload has taken effect (a worker it did not retire runs) and fewer than
// maxOldGenerations workers it retired are still finishing; n is those.
func (c *slot) reloadRoom(pid int) (n int, ok bool) {
	c.mu.Lock()
	retiring := c.retiring
	if c.retiringOf != pid {
		retiring = nil
	}
	// Within a second of a reload its workers may not have taken up the
	// signal (their title not yet "shutting down"): all count as retiring.
	// After that, one that still does not say so was kept by a reload that
	// failed (nginx keeps the old workers): it is the cell's live worker.
	recent := c.s.clk.Since(c.lastHup) < time.Second
	c.mu.Unlock()
	fresh := false
	kids, _ := childrenAsCell(c, pid)
	for _, k := range kids {
		// nginx's titles: "nginx: cache manager process", "nginx:
		// worker process is shutting down".
		switch t := c.title(k.pid); {
		case strings.Contains(t, "cache "):
		case retiring[k] && (recent || strings.Contains(t, "is shutting down")):
			n++
		default:
			fresh = true
		}
	}
	return n, fresh && n < maxOldGenerations
}

// retryReload sends a deferred reload once fewer than maxOldGenerations
// generations are finishing.
func (c *slot) retryReload() {
	c.mu.Lock()
	pid, answered, pending := c.pid, c.answered, c.reloadPending
	c.mu.Unlock()
	if !pending || !answered || pid == 0 {
		return
	}
	if _, ok := c.reloadRoom(pid); !ok {
		return
	}
	if err := c.hup(pid); err != nil {
		c.log.Warn("deferred reload", zap.Error(err))
		return
	}
	c.log.Info("deferred reload sent: an older worker generation has ended")
}

// hup reloads the running master pid gracefully (SIGHUP), noting its
// workers first so that settle can tell when none of them listens.
func (c *slot) hup(pid int) error {
	var old []procID // none known: nothing to wait for
	_ = c.readAsCell(func() (err error) { old, err = children(pid); return err })
	c.mu.Lock()
	c.preReload = old
	c.reloadPending = false
	// Every child of the master now is retired by this reload; those of
	// earlier reloads that are gone are forgotten.
	if c.retiringOf != pid {
		c.retiring, c.retiringOf = nil, pid
	}
	retiring := map[procID]bool{}
	for p := range c.retiring {
		if st, ok := startTime(p.pid); ok && st == p.start {
			retiring[p] = true
		}
	}
	for _, p := range old {
		retiring[p] = true
	}
	c.retiring, c.lastHup = retiring, c.s.clk.Now()
	c.mu.Unlock()
	if err := c.asCell(func() error { return syscall.Kill(pid, syscall.SIGHUP) }); err != nil {
		return fmt.Errorf("reload %s: %w", c.spec.Name, err)
	}
	c.mu.Lock()
	c.reloads++
	c.mu.Unlock()
	return nil
}

// Loaded returns the release sequence a running, ready cell reports having
// loaded from its private status; after a reload, only once no worker of
// before it still listens (settle.go), and 0 until then.
func (s *Supervisor) Loaded(ctx context.Context, name string) (int64, bool, error) {
	c, err := s.slotNamed(name)
	if err != nil {
		return 0, false, err
	}
	if _, st := c.running(); st != StateReady && st != StateDrained {
		return 0, false, nil
	}
	c.retryReload() // one deferred while a publish waits for it
	cs, err := c.cellStatus(ctx)
	if err != nil || cs == nil {
		return 0, false, err
	}
	if !c.settled() {
		return 0, true, nil // an old worker may still take a connection
	}
	c.confirm(cs.Sequence)
	return cs.Sequence, true, nil
}

// cellStatus asks a running cell for its own status.
func (c *slot) cellStatus(ctx context.Context) (*cellapi.Status, error) {
	if pid, _ := c.running(); pid == 0 {
		return nil, nil
	}
	api, err := c.client()
	if err != nil {
		return nil, err
	}
	st, err := api.Status(ctx)
	if err != nil {
		return nil, err
	}
	return &st, nil
}

// liveStatus is Status with every running cell's own report, asked in parallel.
func (s *Supervisor) liveStatus(ctx context.Context, st *Status) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, c := range s.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs, err := c.cellStatus(ctx)
			if err != nil {
				st.Slots[i].CellError = err.Error()
				return
			}
			st.Slots[i].Cell = cs
		}()
	}
	wg.Wait()
}

// monitor reads every running cell's status on an interval and reports new
// refused private calls as security events.
func (s *Supervisor) monitor(ctx context.Context) {
	t := s.clk.NewTicker(s.o.MonitorInterval)
	defer t.Stop()
	for {
		s.beat.Store(s.clk.Now().UnixNano())
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		for _, c := range s.slots {
			cctx, cancel := context.WithTimeout(ctx, cellStatusTimeout)
			cs, err := c.cellStatus(cctx)
			cancel()
			if err != nil || cs == nil {
				continue
			}
			if c.settled() {
				c.confirm(cs.Sequence)
			}
			c.reconcileDrained(ctx, cs.Drained)
			c.mu.Lock()
			seen := c.secSeen
			if cs.Security.AuthFailures < seen {
				seen = 0 // the cell restarted: its counters did too
			}
			c.secSeen = cs.Security.AuthFailures
			c.mu.Unlock()
			if n := cs.Security.AuthFailures - seen; n > 0 {
				c.log.Warn("security event: refused private calls", zap.Int64("new", n),
					zap.Int64("total", cs.Security.AuthFailures), zap.String("last", cs.Security.LastReason))
			}
		}
	}
}

// reconcileDrained drains a cell that answers again while its slot is
// drained and the cell says it is not: a drain kept while the cell did not
// answer (setDrained). Never the other way: a cell that says drained while
// its slot is not is being stopped (a restart, an unassignment), and an
// undrain then would put it back into rotation. An operator's drain or
// undrain in progress (holding the slot's ctl) is left to finish.
func (c *slot) reconcileDrained(ctx context.Context, cellDrained bool) {
	c.mu.Lock()
	want := c.drained
	c.mu.Unlock()
	if !want || cellDrained || !c.ctl.TryLock() {
		return
	}
	defer c.ctl.Unlock()
	api, err := c.client()
	if err != nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, cellStatusTimeout)
	defer cancel()
	if _, err := api.Drain(cctx); err != nil {
		c.log.Warn("the drained slot's cell is not drained; will try again", zap.Error(err))
		return
	}
	c.log.Info("the drained slot's cell took the drain it missed")
}

// Assign changes a slot's pool at run time; slot identity, ports and paths
// do not change. A newly assigned slot starts once its release is active
// (the caller switches it in first). A reassigned running cell keeps running
// and loads its new pool's release on the caller's Reload. An unassigned
// slot's cell is drained, finishes its requests in flight and is stopped:
// Assign returns once nothing runs, or with ctx's error. The caller empties
// the slot's runtime after that.
func (s *Supervisor) Assign(ctx context.Context, name, pool string) error {
	c, err := s.slotNamed(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	prev := c.pool
	c.pool = pool
	c.mu.Unlock()
	if prev == pool {
		return nil
	}
	c.log.Info("cell assignment", zap.String("from", prev), zap.String("to", pool))
	select {
	case c.assignCh <- struct{}{}:
	default:
	}
	if pool != "" || s.o.Refusal != nil {
		return nil
	}
	b := &backoff.Backoff{Initial: 5 * time.Millisecond, Max: 100 * time.Millisecond, Clock: s.clk}
	for {
		c.mu.Lock()
		done := c.pid == 0 && c.state == StateStopped && c.reason == "unassigned"
		c.mu.Unlock()
		if done {
			return nil
		}
		if err := b.Wait(ctx); err != nil {
			return fmt.Errorf("unassign %s: cell still running: %w", name, err)
		}
	}
}
