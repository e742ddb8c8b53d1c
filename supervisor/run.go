package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"cellvisor/runtime"
)

// decide applies the state machine (next) to ev with what the slot is now.
func (c *slot) decide(ev event) (State, action) {
	c.mu.Lock()
	f := facts{state: c.state, drained: c.drained, running: c.pid != 0}
	c.mu.Unlock()
	return next(f, ev)
}

// on applies ev: the slot takes the state the machine chose, with reason,
// and the action is returned for the caller to execute.
func (c *slot) on(ev event, reason string) action {
	st, act := c.decide(ev)
	c.set(st, reason)
	return act
}

// run is the slot's routine: while the slot is assigned, start its cell,
// wait for ready or exit, restart with backoff; while it is unassigned, wait
// for an assignment; until ctx is cancelled.
func (c *slot) run(ctx context.Context) {
	defer c.firstOutcome()
	defer func() {
		if p := c.started; p != nil { // started by startAll, never supervised
			c.started = nil
			c.stop(p, c.s.o.StopTimeout) // with its listeners and spare
		}
	}()
	if c.s.o.Refusal != nil {
		c.on(evRefused, "not started: "+c.s.o.Refusal.Error())
		return
	}
	for ctx.Err() == nil {
		if pool := c.poolName(); pool == "" {
			c.mu.Lock()
			c.switchToLocked(0)
			c.mu.Unlock()
			c.on(evUnassigned, "unassigned")
			c.firstOutcome()
			select {
			case <-ctx.Done():
				return
			case <-c.assignCh:
			}
			continue
		} else {
			c.on(evAssigned, "assigned to "+pool)
		}
		if !c.serve(ctx) {
			return
		}
	}
}

// serve runs the assigned slot's cell until ctx ends (false) or the slot
// is unassigned (true, with nothing left running).
func (c *slot) serve(ctx context.Context) bool {
	if !c.awaitRelease(ctx) {
		return ctx.Err() == nil
	}
	tr := newTracker(c.s.settings().Policy, c.s.o.Jitter)
	tr.live = func() Policy { return c.s.settings().Policy }
	var pending *restartReq // an operator restart waiting for the new cell
	defer func() { answer(&pending, errors.New("cell stopped")) }()
	defer c.dropListeners() // nothing of the slot outlives its run
	// A restart that never got its new master, or its probe's outcome,
	// still counts.
	defer c.saveUnsaved()
	for {
		switch c.runOnce(ctx, tr, &pending) {
		case actEnd, actShutdown:
			return false
		case actIdle:
			return true
		case actStart:
			continue
		}
		c.firstOutcome()
		act, delay := tr.Next()
		c.mu.Lock()
		c.restarts++
		reason := c.lastExit
		c.mu.Unlock()
		c.on(evExit, fmt.Sprintf("%s; restart in %s", reason, delay.Round(time.Millisecond)))
		if act != actBackoff {
			c.unsaved = true // saved once the new master's probe has an outcome
			continue
		}
		c.dropListeners() // refused, not queued, until it runs again
		c.saveCounters()
		switch c.sleep(ctx, delay) {
		case errUnassigned:
			c.on(evUnassign, "unassigned")
			return true
		case nil:
		default:
			c.on(evStop, "agent stopping")
			return false
		}
	}
}

// errUnassigned ends a wait of the slot's routine: the slot was unassigned.
var errUnassigned = errors.New("unassigned")

// sleep waits d, or until ctx ends (its error) or the slot is unassigned
// (errUnassigned).
func (c *slot) sleep(ctx context.Context, d time.Duration) error {
	t := c.s.clk.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
			return nil
		case <-c.assignCh:
			if c.poolName() == "" {
				return errUnassigned
			}
		}
	}
}

// awaitRelease waits until the slot has an active release; it returns false
// when ctx ended or the slot was unassigned first.
func (c *slot) awaitRelease(ctx context.Context) bool {
	for {
		if c.poolName() == "" {
			c.on(evUnassign, "unassigned")
			return false
		}
		meta, err := runtime.Current(c.spec)
		if err == nil {
			c.mu.Lock()
			c.switchToLocked(meta.Sequence)
			c.mu.Unlock()
			return true
		}
		if errors.Is(err, runtime.ErrNoRelease) && c.s.expect.Load() && neverReleased(c.spec) {
			c.on(evAwaitFirst, "waiting for its first release from the manifest source")
		} else {
			c.on(evNoRelease, "runtime missing: "+err.Error())
		}
		c.firstOutcome()
		select {
		case <-ctx.Done():
			c.on(evStop, "agent stopping")
			return false
		case <-c.released:
		case <-c.assignCh:
		}
	}
}

// runOnce starts the cell and supervises it until it exits, is stopped for
// an operator restart, or ctx ends. It returns the machine's action: start
// again at once (an operator restart), back off (an exit or a failed start;
// the tracker has recorded it), or shut down.
func (c *slot) runOnce(ctx context.Context, tr *tracker, pending **restartReq) action {
	c.mu.Lock()
	p := c.adopted
	c.adopted = nil
	c.mu.Unlock()
	var err error
	if p == nil {
		p, c.started = c.started, nil
	}
	if p == nil {
		p, err = c.start()
	}
	if err != nil {
		c.mu.Lock()
		c.lastExit = "start failed: " + err.Error()
		c.mu.Unlock()
		c.log.Error("start cell", zap.Error(err))
		answer(pending, err)
		tr.exit(0)
		_, act := c.decide(evStartFailed)
		return act
	}
	out := c.supervise(ctx, p, pending)
	if out.proc != nil {
		p = out.proc
	}
	switch {
	case out.stopped:
		c.set(StateStopped, "agent stopping")
		return actShutdown
	case out.restart != nil:
		*pending = out.restart
		return c.on(evRestarted, "restarting")
	case out.retired:
		answer(pending, errors.New("cell unassigned"))
		return actIdle
	}
	c.afterExit(p, out.why)
	if *pending != nil {
		// Not c.status(): it reads the group's usage and limits (0.2–0.6
		// ms of cgroup files), on every crash's path to its restart.
		c.mu.Lock()
		last := c.lastExit
		c.mu.Unlock()
		answer(pending, fmt.Errorf("cell exited before it was ready: %s", last))
	}
	tr.exit(out.readyFor)
	_, act := c.decide(evExit)
	return act
}

// answer completes a pending operator restart, if there is one.
func answer(pending **restartReq, err error) {
	if *pending != nil {
		(*pending).done <- err
		*pending = nil
	}
}

// outcome is how one run of a cell ended.
type outcome struct {
	readyFor time.Duration // how long it was ready
	stopped  bool          // stopped because ctx ended
	why      string        // why the agent stopped it itself, if it did
	restart  *restartReq   // stopped for an operator restart
	retired  bool          // stopped because the slot was unassigned
	proc     *proc         // the master at the end, when not the one started (upgradeInPlace)
}

// supervise waits for readiness, exit, an operator restart or cancellation,
// and executes what the state machine decides for each. Once the cell is
// ready it answers a pending restart request.
func (c *slot) supervise(ctx context.Context, p *proc, pending **restartReq) outcome {
	rctx, cancel := context.WithTimeout(ctx, c.s.o.ReadyTimeout)
	defer cancel()
	probe := make(chan error, 1)
	held := c.ln != nil
	go func() { probe <- c.probe(rctx, p.done, held) }()
	c.afterStart(p)
	var out outcome
	var readyAt time.Time
	var live <-chan error // liveness results, once the cell is ready
	// spareDue fires once the cell is ready and every slot has had its
	// first outcome: then the slot's next standby is joined.
	var spareDue <-chan struct{}
	stopLive := func() {}
	finish := func() outcome {
		cancel()
		stopLive()
		if probe != nil {
			<-probe
		}
		if !readyAt.IsZero() {
			out.readyFor = c.s.clk.Since(readyAt)
		}
		return out
	}
	for {
		select {
		case err := <-probe:
			probe = nil
			c.saveUnsaved()
			var ready bool
			if ready, out.why = c.probed(ctx, p, err, pending); ready {
				readyAt = c.s.clk.Now()
				live, stopLive = c.startLiveness(ctx)
				if c.spare == nil {
					spareDue = c.s.ready
				}
			}
		case <-spareDue:
			spareDue = nil
			c.makeSpare()
		case err := <-live:
			why := c.onLiveness(err)
			if why == "" {
				why = c.checkBehind(ctx)
			}
			if why != "" {
				stopLive()
				live = nil
				c.stop(p, time.Second) // it is not serving: no grace to wait out
				out.why = why
			}
		case req := <-c.restartCh:
			if np, done := c.upgradeInPlace(ctx, p, req); done {
				if np != nil {
					p, out.proc = np, np
				}
				continue
			}
			if _, act := c.decide(evRestart); act == actGracefulStop {
				if req.kind == restartUpgrade {
					c.upgradeStop(ctx, p)
				} else {
					c.gracefulStop(ctx, p, "restarting")
				}
			}
			out.restart = req
			return finish()
		case <-c.assignCh:
			if _, act := c.decide(evUnassign); act == actRetire && c.poolName() == "" {
				c.set(StateDrained, "unassigned: draining")
				c.gracefulStop(ctx, p, "unassigned")
				out.retired = true
				return finish()
			}
		case <-p.done:
			return finish()
		case <-ctx.Done():
			if c.s.leave.Load() {
				p.release() // left running for the next agent
			} else {
				c.stop(p, c.s.o.StopTimeout)
			}
			out.stopped = true
			return finish()
		}
	}
}

// probed executes the machine's decision on the readiness probe's result:
// it reports whether the cell is ready, or why the agent stopped it.
func (c *slot) probed(ctx context.Context, p *proc, err error, pending **restartReq) (ready bool, why string) {
	if err == nil {
		if p.adopted {
			c.resyncAdopted(ctx)
		}
		c.onReady()
		answer(pending, nil)
		return true, ""
	}
	if ctx.Err() != nil || closed(p.done) {
		return false, "" // stopping, or exited: its exit is the event
	}
	if _, act := c.decide(evProbeTimeout); act == actKill {
		c.log.Warn("cell not ready in time; stopping it", zap.Error(err))
		c.stop(p, time.Second)
		return false, fmt.Sprintf("not ready within %s (%v)", c.s.o.ReadyTimeout, err)
	}
	return false, ""
}

// neverReleased says the slot's runtime holds no release at all: it never
// had one, or was emptied when unassigned. A release withdrawn because it
// was damaged leaves its directory: that slot is degraded, not waiting.
func neverReleased(s runtime.Slot) bool {
	ents, err := os.ReadDir(filepath.Join(s.RuntimeDir(), "releases"))
	return (err == nil || errors.Is(err, fs.ErrNotExist)) && len(ents) == 0
}
