package supervisor

// The slot's state machine, pure: an event and what the slot is now give
// the state it moves to and what the slot's routine must do. The routine
// (run, supervise, the controls) only executes the action; every decision
// is here, tested by table without processes, cgroups or time.

// event is what happened to a slot.
type event int

const (
	evUnassigned   event = iota // the slot has no pool
	evRefused                   // limits that must be enforced cannot be
	evNoRelease                 // the assigned slot has no release yet
	evReleased                  // a release became active
	evStartFailed               // the cell could not be started
	evReady                     // the readiness probe answered
	evProbeTimeout              // no readiness within the ready timeout
	evExit                      // the cell's master exited
	evRestart                   // an operator asked for a restart
	evRestarted                 // an operator restart stopped the cell
	evDrain                     // an operator drained the cell
	evUndrain                   // an operator undrained the cell
	evStop                      // the agent is stopping
	evUnresponsive              // a ready cell failed its liveness checks FailureThreshold times in a row
	evResponsive                // an unresponsive cell answered again
	evHung                      // a cell failed its liveness checks RestartThreshold times in a row
	evAssigned                  // an unassigned slot was assigned to a pool
	evUnassign                  // the slot's assignment was withdrawn
	evAwaitFirst                // the assigned slot has never had a release, and a manifest source is to deliver one
	evBehind                    // the running cell serves an older release than its switched one past the grace
	evCaughtUp                  // a cell that was behind serves its switched release
	evStale                     // a cell stayed behind past the restart bound

	numEvents // not an event: how many there are
)

var eventNames = [...]string{"unassigned", "refused", "no release", "released", "start failed", "ready",
	"probe timeout", "exit", "restart", "restarted", "drain", "undrain", "stop", "unresponsive", "responsive", "hung", "assigned", "unassign", "await first release", "behind", "caught up", "stale"}

func (e event) String() string { return eventNames[e] }

// action is what the slot's routine does next.
type action int

const (
	actNone         action = iota // nothing: keep waiting
	actEnd                        // the routine ends (nothing runs)
	actAwaitRelease               // wait for a release, then start
	actStart                      // start the cell now
	actKill                       // stop the running cell (it failed its readiness); its exit follows
	actBackoff                    // start again after the restart tracker's delay
	actGracefulStop               // drain, let requests in flight finish, stop; then start at once
	actRefuse                     // refuse the request: the cell is not running
	actReload                     // reload the running cell (SIGHUP) to apply a setting
	actShutdown                   // stop the running cell for good and end
	actIdle                       // nothing runs: wait for an assignment
	actRetire                     // drain the running cell, let requests in flight finish, stop it; then idle
)

var actionNames = [...]string{"none", "end", "await release", "start", "kill", "backoff", "graceful stop",
	"refuse", "reload", "shutdown", "idle", "retire"}

func (a action) String() string { return actionNames[a] }

// facts is what the machine knows of a slot.
type facts struct {
	state   State
	drained bool // the slot is drained (persisted; survives restarts)
	running bool // a cell master of this slot is running
}

// next is the slot's transition on ev: its next state and the action.
func next(f facts, ev event) (State, action) {
	switch ev {
	case evRefused:
		return StateStopped, actEnd
	case evUnassigned:
		// An unassigned slot runs nothing and has an empty runtime; its
		// routine waits for an assignment.
		return StateStopped, actIdle
	case evAssigned:
		return f.state, actAwaitRelease
	case evUnassign:
		// The cell is retired like an operator restart stops it (drained,
		// requests in flight finish), but is not started again.
		if f.running {
			return StateDrained, actRetire
		}
		return StateStopped, actIdle
	case evNoRelease:
		return StateDegraded, actAwaitRelease
	case evAwaitFirst:
		// Nothing is wrong yet: a fresh edge before its first manifest.
		return StateWaiting, actAwaitRelease
	case evReleased:
		return f.state, actStart
	case evReady:
		if f.drained {
			return StateDrained, actNone
		}
		return StateReady, actNone
	case evUnresponsive:
		return StateDegraded, actNone
	case evResponsive:
		if f.drained {
			return StateDrained, actNone
		}
		return StateReady, actNone
	case evBehind:
		// It serves, but not what it was given: not ready for it.
		if f.running {
			return StateDegraded, actNone
		}
		return f.state, actNone
	case evCaughtUp:
		if !f.running {
			return f.state, actNone
		}
		if f.drained {
			return StateDrained, actNone
		}
		return StateReady, actNone
	case evHung, evStale:
		// Like a probe timeout: stop it; its exit restarts it, counted
		// and backed off like a crash.
		if f.running {
			return StateDegraded, actKill
		}
		return f.state, actNone
	case evProbeTimeout:
		// A timeout is not proof of death: a cell that is still running is
		// stopped, and only its exit (which follows) leads to a restart, so
		// that two masters never compete for the slot's ports.
		if f.running {
			return f.state, actKill
		}
		return f.state, actNone
	case evExit, evStartFailed:
		return StateDegraded, actBackoff
	case evRestart:
		if !f.running {
			return f.state, actRefuse
		}
		return f.state, actGracefulStop
	case evRestarted:
		// Nothing is left running: start again at once, with no backoff.
		return StateDegraded, actStart
	case evDrain, evUndrain:
		st := f.state
		switch {
		case ev == evDrain && st == StateReady:
			st = StateDrained
		case ev == evUndrain && st == StateDrained:
			st = StateReady
		}
		if f.running {
			return st, actReload
		}
		return st, actNone
	case evStop:
		if f.running {
			return StateStopped, actShutdown
		}
		return StateStopped, actEnd
	}
	return f.state, actNone
}
