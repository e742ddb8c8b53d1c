package supervisor

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// A cell is given a release by a load (the worker reads its data) or a
// reload (new workers read it). Either can fail to take effect: the load is
// refused and the reload after it fails, the master is stopped and never
// takes up its SIGHUP, an old worker keeps listening. The cell then serves
// the release before, and what the agent reports must say so: a slot's
// sequence is the one the cell reports serving (served), never the one the
// agent switched in (seq). A running cell still serving an older release
// BehindGrace after the switch is not ready for it: degraded, with the two
// sequences as its reason, and reloaded once more; past BehindRestart it
// is restarted (a new master reads the switched release), like a hung one.
// A reload the agent itself holds back (reloadPending: older generations
// still finishing) is not a failure and is not counted.

// behindState is a slot found serving an older release than its switched
// one: since when, and why (its state's reason). Zero while it is not.
type behindState struct {
	since  time.Time
	reason string
}

// switchToLocked records the switched release's sequence (c.mu held): when it
// changes, the grace for the cell to take it starts anew.
func (c *slot) switchToLocked(seq int64) {
	if seq != c.seq {
		c.seq, c.switchedAt = seq, c.s.clk.Now()
	}
}

// confirm records the sequence the running cell reported serving.
func (c *slot) confirm(seq int64) {
	c.mu.Lock()
	c.served = seq
	c.mu.Unlock()
}

// askServed asks the running cell which release it serves and records
// the answer; ok is false when it did not answer, or when a worker of
// before its last reload still listens (its answer would not be the
// cell's).
func (c *slot) askServed(ctx context.Context) (int64, bool) {
	ctx, cancel := context.WithTimeout(ctx, cellStatusTimeout)
	defer cancel()
	cs, err := c.cellStatus(ctx)
	if err != nil || cs == nil || !c.settled() {
		return 0, false
	}
	c.confirm(cs.Sequence)
	return cs.Sequence, true
}

// checkBehind is the liveness check's look at the release the running cell
// serves (see above); it returns why the cell is to be restarted, "" to
// keep it.
func (c *slot) checkBehind(ctx context.Context) (restartWhy string) {
	p := c.s.settings().Liveness
	c.mu.Lock()
	pid, answered, pending := c.pid, c.answered, c.reloadPending
	served, want, switched, b, st := c.served, c.seq, c.switchedAt, c.behind, c.state
	c.mu.Unlock()
	if pid == 0 || !answered || want == 0 {
		return ""
	}
	if served < want && !pending && (served == 0 || c.s.clk.Since(switched) >= p.BehindGrace) {
		// Not known yet (an adopted cell), or the monitor's look may be
		// older than the reload: ask now.
		if got, ok := c.askServed(ctx); ok {
			served = got
		}
	}
	switch {
	case served >= want:
		if !b.since.IsZero() {
			c.mu.Lock()
			c.behind = behindState{}
			c.mu.Unlock()
			c.log.Info("cell serves its release again", zap.Int64("sequence", served))
			c.on(evCaughtUp, "")
		}
		return ""
	case pending || c.s.clk.Since(switched) < p.BehindGrace:
		return ""
	case b.since.IsZero():
		reason := fmt.Sprintf("serving sequence %d, current %d: the cell did not take its release", served, want)
		c.mu.Lock()
		c.behind = behindState{since: c.s.clk.Now(), reason: reason}
		c.mu.Unlock()
		c.log.Warn("cell did not take its release; reloading it again",
			zap.Int64("serving", served), zap.Int64("current", want), zap.Duration("restart_after", p.BehindRestart))
		c.on(evBehind, reason)
		if err := c.s.Reload(c.spec.Name); err != nil {
			c.log.Warn("reload of a cell behind its release", zap.Error(err))
		}
		return ""
	case c.s.clk.Since(b.since) >= p.BehindRestart:
		why := fmt.Sprintf("%s in %s; restarted", b.reason, p.BehindRestart)
		if c.on(evStale, why) == actKill {
			c.log.Error("cell still behind its release; restarting it", zap.Int64("serving", served), zap.Int64("current", want))
			return why
		}
	case st == StateReady || st == StateDrained:
		// Made ready meanwhile (it answered its liveness checks again):
		// it is still behind.
		c.on(evBehind, b.reason)
	}
	return ""
}
