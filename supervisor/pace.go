package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// The paced policy (runtime_upgrade: paced) rolls the cells as auto does,
// verified first and one at a time, but once a cell runs the new binary the
// roll waits runtime_upgrade_pace before it takes the next one, and goes on
// only if that cell stayed ready with the same master all along: a runtime
// that crashes, or stops answering its readiness, under real traffic after
// a while stops the roll at one cell, the others keeping the old binary.
// The pace is read afresh while waiting, so a reload that shortens it (or
// changes the policy) takes effect in the wait; an operator's roll
// (UpgradeRuntime) takes the remaining cells without it.

// DefaultUpgradePace is runtime_upgrade_pace's default.
const DefaultUpgradePace = 5 * time.Minute

// paceTick is how often the pace's wait looks at the rolled cell.
const paceTick = 100 * time.Millisecond

var (
	// errPaceForced ends a pace: the operator asked for the roll.
	errPaceForced = errors.New("the operator's roll goes on without the pace")
	// errPaceManual ends a roll: the policy was reloaded as manual.
	errPaceManual = errors.New("runtime_upgrade is manual now: the roll waits for the operator")
)

// pace waits until the cell rolled, just moved onto the new binary, has
// stayed ready for the pace, before the roll takes next; st is the roll's
// state, whose reason says what it waits for meanwhile. Its error says why
// the roll must not go on.
func (s *Supervisor) pace(ctx context.Context, rolled, next *slot, st *upgradeState) (err error) {
	pid, _ := rolled.running()
	since := s.clk.Now()
	defer func() {
		// The roll goes on: its state no longer says it waits.
		if st.err != "" && (err == nil || errors.Is(err, errPaceForced)) {
			st.err = ""
			s.setUpgrade(*st)
		}
	}()
	for {
		set := s.settings()
		switch {
		case s.forceRoll.Swap(false):
			return errPaceForced
		case set.RuntimeUpgrade == UpgradeManual:
			return errPaceManual
		case set.RuntimeUpgrade != UpgradePaced:
			return nil // auto now: no pace
		}
		npid, state := rolled.running()
		if npid != pid || (state != StateReady && state != StateDrained) {
			return fmt.Errorf("%s did not stay ready on the new binary for runtime_upgrade_pace (%s): now %s, pid %d (was %d)",
				rolled.spec.Name, set.RuntimeUpgradePace, state, npid, pid)
		}
		until := since.Add(set.RuntimeUpgradePace)
		left := until.Sub(s.clk.Now())
		if left <= 0 {
			return nil
		}
		if why := fmt.Sprintf("paced: %s rolled; %s next at %s if %s stays ready (runtime_upgrade_pace %s)",
			rolled.spec.Name, next.spec.Name, until.UTC().Format(time.RFC3339), rolled.spec.Name, set.RuntimeUpgradePace); st.err != why {
			st.err = why
			s.setUpgrade(*st)
		}
		t := s.clk.NewTimer(min(left, paceTick))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
	}
}

// paceStopped records a roll that a pace ended (err, not errPaceForced)
// after the cell rolled, and returns err: under manual now, nothing is
// rolling (the routine then says the cells wait for the operator);
// otherwise the roll failed, the remaining cells keeping the old binary.
func (s *Supervisor) paceStopped(ctx context.Context, rolled *slot, st *upgradeState, err error) error {
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, errPaceManual):
		s.setUpgrade(upgradeState{target: st.target, rolled: st.rolled})
	default:
		st.state, st.err = UpgradeFailed, err.Error()
		s.setUpgrade(*st)
		s.log.Error("runtime upgrade stopped: the remaining cells keep the old binary", zap.String("cell", rolled.spec.Name), zap.Error(err))
	}
	return err
}
