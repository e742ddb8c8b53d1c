package supervisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	"cellvisor/runtime"
	"cellvisor/runtimebin"
)

// Rolling the cells onto a new binary. Once the configured binary's file
// changed and running masters still run the old one (superseded.go), the
// runtime routine verifies the new binary against every assigned cell's
// configuration (-t as the cell's user: its modules load, its directives
// parse) and, only if every cell's passes, restarts the superseded cells
// one at a time onto it:
//
//   - a cell is rolled only while every other cell of its pool is ready, so
//     a pool never has two cells down for the roll;
//   - the restart drains the cell (its readiness answers 503), waits for
//     requests in flight up to the drain timeout, stops the master
//     gracefully (SIGQUIT) and starts the new one on the listening sockets
//     the agent holds: connections that arrive meanwhile wait in the listen
//     backlog and are answered by the new master;
//   - the roll stops at the first cell that does not come back ready; the
//     others keep the old binary, and status and the log say why.
//
// nginx's own binary upgrade (USR2) is not used for a master this agent
// started: the cells run with "daemon off" as the agent's children, and
// nginx ignores USR2 while its parent is the process that started it (and
// WINCH when not daemonized). docs/cells.md says so for operators.

// UpgradePolicy is how cells reach a new binary.
type UpgradePolicy string

// Upgrade policies (agent.yaml runtime_upgrade).
const (
	UpgradeAuto   UpgradePolicy = "auto"   // rolled as soon as the new binary is verified
	UpgradePaced  UpgradePolicy = "paced"  // rolled as auto, a cell every runtime_upgrade_pace (pace.go)
	UpgradeManual UpgradePolicy = "manual" // rolled when an operator says so (UpgradeRuntime)
)

// Upgrade states, as status reports them.
const (
	UpgradeIdle    = ""        // nothing to do, or done
	UpgradeRolling = "rolling" // cells are being restarted onto the new binary
	UpgradeRefused = "refused" // the new binary failed its verification: no cell touched
	UpgradeFailed  = "failed"  // a rolled cell did not come back ready: the roll stopped
	UpgradeWaiting = "waiting" // the policy is manual: an operator starts the roll
)

// upgradeState is the last roll, under Supervisor.upMu.
type upgradeState struct {
	state  string
	err    string
	target runtimeTarget // the binary and modules the state is about
	rolled int           // cells rolled onto it so far
}

// verifyTimeout bounds one cell's -t of a new binary: a bound on a hang,
// not a budget (a -t takes tens of milliseconds on a host, seconds on a
// loaded emulated one, in the agent's cgroup at its CPU limit).
const verifyTimeout = 2 * time.Minute

// poolReadyTimeout bounds the wait for a pool's other cells to be ready
// before one of its cells is rolled.
const poolReadyTimeout = 2 * time.Minute

// errNotSuperseded says a cell runs the current binary already.
var errNotSuperseded = errors.New("the cell runs the current binary")

// superseded lists the running slots whose master runs another file than
// cur, read afresh from /proc.
func (s *Supervisor) superseded(cur *binInfo) []*slot {
	var out []*slot
	for _, c := range s.slots {
		pid, _ := c.running()
		if pid == 0 || c.poolName() == "" {
			continue
		}
		id, err := c.exeID(pid)
		if err != nil {
			continue // gone, or not readable: not told superseded
		}
		stale := c.staleModules(pid, s.o.Watch)
		c.mu.Lock()
		if c.pid == pid {
			c.bin.staleModules = stale
		}
		if c.pid == pid && c.bin.known && c.bin.ID != id {
			// Started from a file replaced between the stat and the exec.
			c.bin = cellBin{binInfo: binInfo{ID: id}, known: true}
			if id == cur.ID {
				c.bin.Version = cur.Version
			}
		}
		c.mu.Unlock()
		if id != cur.ID || stale != "" {
			out = append(out, c)
		}
	}
	return out
}

// verify runs the new binary's -t with every assigned cell's active
// configuration, as each cell's user; it returns the first refusal.
func (s *Supervisor) verify(ctx context.Context) error {
	for _, c := range s.slots {
		if c.poolName() == "" {
			continue
		}
		if _, err := runtime.Current(c.spec); err != nil {
			continue // no release: nothing of it runs
		}
		t := runtimebin.Test{Binary: s.o.Binary, Prefix: c.spec.Dir + "/", Conf: c.spec.ConfPath(),
			ErrorLog: filepath.Join(c.spec.LogsDir(), "error.log")}
		if u := c.user(); u != nil {
			t.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, NoSetGroups: true}
			t.As = c.asCell
		}
		vctx, cancel := context.WithTimeout(ctx, verifyTimeout)
		start := time.Now()
		err := t.Run(vctx)
		cancel()
		if err != nil {
			return fmt.Errorf("verify with %s's configuration (after %s): %w", c.spec.Name, time.Since(start).Round(time.Millisecond), err)
		}
		c.log.Info("new runtime verified with the cell's configuration", zap.String("binary", s.o.Binary), zap.Duration("took", time.Since(start)))
	}
	return nil
}

// setUpgrade records the roll's state and logs a change.
func (s *Supervisor) setUpgrade(st upgradeState) {
	s.upMu.Lock()
	prev := s.up
	s.up = st
	s.upMu.Unlock()
	if prev.state != st.state || prev.err != st.err {
		s.log.Info("runtime upgrade", zap.String("state", orNone(st.state)), zap.String("error", st.err), zap.Int("rolled", st.rolled))
	}
}

func orNone(s string) string {
	if s == "" {
		return "idle"
	}
	return s
}

// upgrade is the last roll's state.
func (s *Supervisor) upgrade() upgradeState {
	s.upMu.Lock()
	defer s.upMu.Unlock()
	return s.up
}

// roll verifies the configured binary and rolls every superseded cell onto
// it, one at a time; it returns why it stopped, if it did. A binary that
// was refused or failed is not tried again until it changes, unless force.
func (s *Supervisor) roll(ctx context.Context, force bool) error {
	s.learnVersion(ctx)
	cur := s.bin.Load()
	if cur == nil {
		return fmt.Errorf("%w: %s cannot be read", ErrBinary, s.o.Binary)
	}
	target := s.targetOf(cur)
	todo := s.superseded(cur)
	if len(todo) == 0 {
		if up := s.upgrade(); up.target != target || up.state == UpgradeRolling {
			s.setUpgrade(upgradeState{target: target, rolled: up.rolled})
		}
		return nil
	}
	if up := s.upgrade(); !force && up.target == target && (up.state == UpgradeRefused || up.state == UpgradeFailed) {
		return errors.New(up.err) // told already; a new file or an operator tries again
	}
	if cur.Version == "" {
		err := fmt.Errorf("%w: %s does not say its version (-v)", ErrBinary, s.o.Binary)
		s.refuse(target, err)
		return err
	}
	if err := s.verify(ctx); err != nil {
		if ctx.Err() == nil {
			s.refuse(target, err)
		}
		return err
	}
	st := upgradeState{state: UpgradeRolling, target: target}
	s.setUpgrade(st)
	var last *slot // the cell rolled last, which a pace watches
	for _, c := range todo {
		if last != nil && !force && s.settings().RuntimeUpgrade == UpgradePaced {
			err := s.pace(ctx, last, c, &st)
			if errors.Is(err, errPaceForced) {
				force = true // the operator's roll: the rest without the pace
			} else if err != nil {
				return s.paceStopped(ctx, last, &st, err)
			}
		}
		if err := s.rollCell(ctx, c, cur); err != nil {
			if errors.Is(err, errNotSuperseded) {
				continue
			}
			if ctx.Err() != nil {
				return err
			}
			st.state, st.err = UpgradeFailed, fmt.Sprintf("%s: %v", c.spec.Name, err)
			s.setUpgrade(st)
			s.log.Error("runtime upgrade stopped: the remaining cells keep the old binary", zap.String("cell", c.spec.Name), zap.Error(err))
			return err
		}
		st.rolled++
		s.setUpgrade(st)
		last = c
	}
	st.state = UpgradeIdle
	s.setUpgrade(st)
	s.log.Info("every cell runs the new binary", zap.String("version", cur.Version), zap.Int("rolled", st.rolled))
	return nil
}

// refuse records a binary (or module) refused before any cell was touched.
func (s *Supervisor) refuse(target runtimeTarget, err error) {
	s.setUpgrade(upgradeState{state: UpgradeRefused, err: err.Error(), target: target})
	s.log.Error("new cell binary refused: every cell keeps the old one", zap.String("binary", s.o.Binary), zap.Error(err))
}

// rollCell restarts c onto the binary cur, once every other cell of its
// pool is ready, and checks the new master runs cur.
func (s *Supervisor) rollCell(ctx context.Context, c *slot, cur *binInfo) error {
	if err := s.awaitPool(ctx, c); err != nil {
		return err
	}
	pid, _ := c.running()
	if pid == 0 {
		return errNotSuperseded // stopped meanwhile: its next start takes the new binary
	}
	if id, err := c.exeID(pid); err != nil || (id == cur.ID && c.staleModules(pid, s.o.Watch) == "") {
		return errNotSuperseded
	}
	c.log.Info("rolling the cell onto the new binary", zap.Int("pid", pid), zap.String("version", cur.Version))
	bound := s.settings().DrainTimeout + s.o.StopTimeout + s.o.ReadyTimeout + 10*time.Second
	rctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if err := s.restartFor(rctx, c, restartUpgrade); err != nil {
		return err
	}
	npid, _ := c.running()
	id, err := c.exeID(npid)
	if err != nil {
		return fmt.Errorf("read the new master's binary: %w", err)
	}
	if id != cur.ID {
		return fmt.Errorf("the new master %d does not run %s as it is now (replaced again?)", npid, s.o.Binary)
	}
	if m := c.staleModules(npid, s.o.Watch); m != "" {
		return fmt.Errorf("the new master %d maps a replaced %s (replaced again?)", npid, m)
	}
	c.log.Info("cell runs the new binary", zap.Int("pid", npid), zap.Int("was", pid))
	return nil
}

// awaitPool waits until every other assigned cell of c's pool is ready.
func (s *Supervisor) awaitPool(ctx context.Context, c *slot) error {
	pool := c.poolName()
	wctx, cancel := context.WithTimeout(ctx, poolReadyTimeout)
	defer cancel()
	for {
		var waiting string
		for _, o := range s.slots {
			if o == c || o.poolName() != pool {
				continue
			}
			if _, st := o.running(); st != StateReady && st != StateDrained {
				waiting = o.spec.Name
				break
			}
		}
		if waiting == "" {
			return nil
		}
		t := s.clk.NewTimer(50 * time.Millisecond)
		select {
		case <-wctx.Done():
			t.Stop()
			return fmt.Errorf("pool %s: %s is not ready: %w", pool, waiting, wctx.Err())
		case <-t.C():
		}
	}
}

// restartKind tells the slot's routine how to stop the master of a
// restart.
type restartKind int

const (
	restartOperator restartKind = iota // drain, stop, start (listeners closed meanwhile)
	restartUpgrade                     // drain, stop, start on the held listeners
)

// restartFor asks c's routine for a restart of kind and waits until the new
// master is ready: an upgrade's restart is not an operator's (no rate
// limit, not counted).
func (s *Supervisor) restartFor(ctx context.Context, c *slot, kind restartKind) error {
	c.ctl.Lock()
	defer c.ctl.Unlock()
	if st, act := c.decide(evRestart); act == actRefuse {
		return fmt.Errorf("%w: %s is %s", ErrNotRunning, c.spec.Name, st)
	}
	req := &restartReq{done: make(chan error, 1), kind: kind}
	select {
	case c.restartCh <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("still restarting: %w", ctx.Err())
	}
}

// upgradeStop is the stop of an upgrade's restart: drain, wait for requests
// in flight up to the drain timeout, then stop gracefully keeping the
// listeners (and the spare) for the new master.
func (c *slot) upgradeStop(ctx context.Context, p *proc) {
	why := "upgrading the runtime"
	drain := c.s.settings().DrainTimeout
	deadline := c.s.clk.Now().Add(drain)
	c.drainInFlight(ctx, drain, why)
	c.set(StateDegraded, why+": stopping")
	c.stopHeld(p, max(deadline.Sub(c.s.clk.Now()), 100*time.Millisecond))
}

// drainInFlight drains the cell and waits, up to d, until no request is in
// flight.
func (c *slot) drainInFlight(ctx context.Context, d time.Duration, why string) {
	dctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	api, err := c.client()
	if err != nil {
		return
	}
	if _, err := api.Drain(dctx); err != nil {
		c.log.Warn(why+": drain", zap.Error(err))
	}
	c.set(StateDrained, why+": waiting for requests in flight")
	for dctx.Err() == nil {
		st, err := api.Status(dctx)
		if err != nil || st.Connections.InFlight() == 0 {
			return
		}
		t := c.s.clk.NewTimer(10 * time.Millisecond)
		select {
		case <-dctx.Done():
		case <-t.C():
		}
		t.Stop()
	}
}

// stopHeld stops the master as stop does, but keeps the slot's listeners
// and spare: the next start takes them at once, and connections that
// arrive meanwhile wait in the backlog. Where the slot holds no listeners
// (an adopted master holds the only copies) the ports close with it.
func (c *slot) stopHeld(p *proc, grace time.Duration) {
	_ = c.asCell(func() error { return p.signal(syscall.SIGQUIT) })
	t := c.s.clk.NewTimer(grace)
	select {
	case <-p.done:
		t.Stop()
	case <-t.C():
		c.log.Warn("cell did not stop in time; killing it", zap.Duration("grace", grace))
		if p.adopted {
			_ = c.asCell(func() error { return p.signal(syscall.SIGKILL) })
		} else {
			_ = c.asCell(func() error { return syscall.Kill(-p.pid, syscall.SIGKILL) })
		}
	}
	c.killLeftovers(true)
	<-p.done
	c.removeRecord()
	c.mu.Lock()
	c.pid, c.served, c.behind = 0, 0, behindState{}
	c.mu.Unlock()
}

// runtimeLoop watches the configured binary (and Options.Watch) and, once
// every slot has had its first outcome, rolls superseded cells onto a new
// binary (roll): at once, whenever a watched file changed (after a quiet
// second: a package unpacks several files), and when woken (CheckRuntime,
// a status that saw the file change), until ctx ends.
func (s *Supervisor) runtimeLoop(ctx context.Context) {
	changed, stop := s.watchRuntime(ctx)
	defer stop()
	// The version is learned (an exec of the binary) once the cells have
	// started, not beside their starts; their records are completed then.
	select {
	case <-s.ready:
	case <-ctx.Done():
		return
	}
	for {
		s.learnVersion(ctx)
		force := s.forceRoll.Swap(false)
		if s.settings().RuntimeUpgrade == UpgradeManual && !force {
			s.awaitOperator()
		} else if err := s.roll(ctx, force); err != nil && ctx.Err() == nil {
			s.log.Debug("runtime roll", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-changed:
		}
	}
}

// CheckRuntime wakes the runtime routine to look at the binary (SIGHUP).
func (s *Supervisor) CheckRuntime() { s.kickRuntime() }

// awaitOperator records, under the manual policy, that cells run a
// superseded binary and wait for an operator's roll.
func (s *Supervisor) awaitOperator() {
	cur := s.bin.Load()
	if cur == nil {
		return
	}
	up := s.upgrade()
	target := s.targetOf(cur)
	n := len(s.superseded(cur))
	if up.state == UpgradeWaiting && n == 0 {
		s.setUpgrade(upgradeState{target: target}) // restarted meanwhile: nothing waits
		return
	}
	if up.state == UpgradeRolling || (up.target == target && up.state != UpgradeIdle) {
		return
	}
	if n > 0 {
		s.setUpgrade(upgradeState{state: UpgradeWaiting, target: target,
			err: fmt.Sprintf("runtime_upgrade is manual: %d cell(s) run a superseded binary until cellvisor upgrade-runtime", n)})
	}
}
