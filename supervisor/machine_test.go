package supervisor

import "testing"

// TestNext is the slot's state machine, pure: it runs in microseconds,
// without root, cells or time.
func TestNext(t *testing.T) {
	ready := facts{state: StateReady, running: true}
	drainedReady := facts{state: StateDrained, drained: true, running: true}
	starting := facts{state: StateStopped, running: true}     // first start, not ready yet
	restarting := facts{state: StateDegraded, running: true}  // started again after a crash
	crashed := facts{state: StateDegraded}                    // waiting for its restart
	stopped := facts{state: StateStopped}                     // never started
	drainedDown := facts{state: StateDegraded, drained: true} // a drained slot's cell crashed
	tests := []struct {
		name  string
		f     facts
		ev    event
		state State
		act   action
	}{
		{"an unassigned slot stays stopped and waits for an assignment", stopped, evUnassigned, StateStopped, actIdle},
		{"an assignment makes an idle slot wait for its release", stopped, evAssigned, StateStopped, actAwaitRelease},
		{"unassigning a ready cell drains and retires it", ready, evUnassign, StateDrained, actRetire},
		{"unassigning a drained cell retires it", drainedReady, evUnassign, StateDrained, actRetire},
		{"unassigning a starting cell retires it", starting, evUnassign, StateDrained, actRetire},
		{"unassigning a crashed cell waiting for its restart idles", crashed, evUnassign, StateStopped, actIdle},
		{"unassigning a slot waiting for its release idles", facts{state: StateDegraded}, evUnassign, StateStopped, actIdle},
		{"refused limits keep the cell stopped", stopped, evRefused, StateStopped, actEnd},
		{"an assigned slot with no release is degraded and waits", stopped, evNoRelease, StateDegraded, actAwaitRelease},
		{"an assigned slot before its first release from a manifest source is waiting", stopped, evAwaitFirst, StateWaiting, actAwaitRelease},
		{"a release arriving starts the cell", facts{state: StateDegraded}, evReleased, StateDegraded, actStart},
		{"ready makes a starting cell ready", starting, evReady, StateReady, actNone},
		{"ready after a crash makes it ready", restarting, evReady, StateReady, actNone},
		{"a drained slot's cell becomes drained, not ready", facts{state: StateDegraded, drained: true, running: true}, evReady, StateDrained, actNone},
		{"a timeout is not proof of death: a running cell is killed, not restarted", starting, evProbeTimeout, StateStopped, actKill},
		{"a timeout after a crash keeps the state and kills", restarting, evProbeTimeout, StateDegraded, actKill},
		{"a timeout of a cell already gone waits for its exit", facts{state: StateDegraded}, evProbeTimeout, StateDegraded, actNone},
		{"a crash of a ready cell degrades it and backs off", ready, evExit, StateDegraded, actBackoff},
		{"a crash of a drained cell degrades it and backs off", drainedReady, evExit, StateDegraded, actBackoff},
		{"a crash before ready backs off", starting, evExit, StateDegraded, actBackoff},
		{"a failed start backs off", stopped, evStartFailed, StateDegraded, actBackoff},
		{"an operator restart of a ready cell stops it gracefully", ready, evRestart, StateReady, actGracefulStop},
		{"an operator restart of a drained cell stops it gracefully", drainedReady, evRestart, StateDrained, actGracefulStop},
		{"an operator restart of a starting cell stops it gracefully", starting, evRestart, StateStopped, actGracefulStop},
		{"an operator restart of a crashed cell is refused", crashed, evRestart, StateDegraded, actRefuse},
		{"an operator restart of a stopped cell is refused", stopped, evRestart, StateStopped, actRefuse},
		{"a ready cell that stops answering is degraded, not yet restarted", ready, evUnresponsive, StateDegraded, actNone},
		{"a drained cell that stops answering is degraded", drainedReady, evUnresponsive, StateDegraded, actNone},
		{"an unresponsive cell that answers again is ready, without a restart", facts{state: StateDegraded, running: true}, evResponsive, StateReady, actNone},
		{"an unresponsive drained cell that answers again is drained", facts{state: StateDegraded, drained: true, running: true}, evResponsive, StateDrained, actNone},
		{"a hung cell is killed; its exit restarts it like a crash", facts{state: StateDegraded, running: true}, evHung, StateDegraded, actKill},
		{"a hung cell already gone waits for its exit", crashed, evHung, StateDegraded, actNone},
		{"a ready cell serving an older release than its switched one is degraded", ready, evBehind, StateDegraded, actNone},
		{"a drained cell serving an older release is degraded", drainedReady, evBehind, StateDegraded, actNone},
		{"a cell that is not running is not behind", crashed, evBehind, StateDegraded, actNone},
		{"a cell that caught up is ready", facts{state: StateDegraded, running: true}, evCaughtUp, StateReady, actNone},
		{"a drained cell that caught up is drained", facts{state: StateDegraded, drained: true, running: true}, evCaughtUp, StateDrained, actNone},
		{"a cell that caught up as it exited waits for its restart", crashed, evCaughtUp, StateDegraded, actNone},
		{"a cell behind past the bound is killed; its exit restarts it", facts{state: StateDegraded, running: true}, evStale, StateDegraded, actKill},
		{"after a graceful stop the cell starts at once", restarting, evRestarted, StateDegraded, actStart},
		{"drain of a ready cell: drained, reloaded", ready, evDrain, StateDrained, actReload},
		{"drain of a drained cell: unchanged, reloaded", drainedReady, evDrain, StateDrained, actReload},
		{"drain of a crashed cell: the state stays, nothing to reload", crashed, evDrain, StateDegraded, actNone},
		{"drain of a starting cell: not ready yet, reloaded", starting, evDrain, StateStopped, actReload},
		{"undrain of a drained cell: ready, reloaded", drainedReady, evUndrain, StateReady, actReload},
		{"undrain of a ready cell: unchanged", ready, evUndrain, StateReady, actReload},
		{"undrain of a crashed drained slot: still degraded", drainedDown, evUndrain, StateDegraded, actNone},
		{"stop of a running cell shuts it down", ready, evStop, StateStopped, actShutdown},
		{"stop of a drained running cell shuts it down", drainedReady, evStop, StateStopped, actShutdown},
		{"stop while backing off ends", crashed, evStop, StateStopped, actEnd},
		{"stop while waiting for a release ends", facts{state: StateDegraded}, evStop, StateStopped, actEnd},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, act := next(tc.f, tc.ev)
			if st != tc.state || act != tc.act {
				t.Errorf("next(%+v, %s) = %s, %s; want %s, %s", tc.f, tc.ev, st, act, tc.state, tc.act)
			}
		})
	}
}

// TestNextHandlesEveryEvent guards the machine: every event has a name and
// a decision that is not the fallthrough's silent no-op, unless chosen.
func TestNextHandlesEveryEvent(t *testing.T) {
	for ev := evUnassigned; ev < numEvents; ev++ {
		if ev.String() == "" {
			t.Errorf("event %d has no name", ev)
		}
		_, act := next(facts{state: StateReady, running: true}, ev)
		if int(act) >= len(actionNames) {
			t.Errorf("%s: unknown action %d", ev, act)
		}
	}
	if len(eventNames) != int(numEvents) {
		t.Errorf("%d event names for %d events", len(eventNames), numEvents)
	}
}

// TestLivenessEvent: which check results move the machine, for the default
// thresholds (3 to degrade, 6 to restart).
func TestLivenessEvent(t *testing.T) {
	p := LivenessPolicy{}.withDefaults()
	tests := []struct {
		before, after int
		ev            event
		ok            bool
	}{
		{0, 0, 0, false}, // answered, as before
		{0, 1, 0, false}, // one miss is noise
		{1, 2, 0, false},
		{2, 3, evUnresponsive, true}, // the threshold: degraded
		{3, 4, 0, false},             // still degraded, said once
		{4, 5, 0, false},
		{5, 6, evHung, true}, // restart
		{6, 7, evHung, true}, // still hung (its kill is under way)
		{2, 0, 0, false},     // a brief stall under the threshold: nothing to undo
		{3, 0, evResponsive, true},
		{5, 0, evResponsive, true},
	}
	for _, tc := range tests {
		ev, ok := livenessEvent(tc.before, tc.after, p)
		if ok != tc.ok || ok && ev != tc.ev {
			t.Errorf("%d → %d failures: %v %v, want %v %v", tc.before, tc.after, ev, ok, tc.ev, tc.ok)
		}
	}
	// A restart threshold below the failure threshold is raised to it.
	if q := (LivenessPolicy{FailureThreshold: 5, RestartThreshold: 2}).withDefaults(); q.RestartThreshold != 5 {
		t.Errorf("restart threshold %d, want 5", q.RestartThreshold)
	}
}
