package supervisor

import (
	"os"
	"os/exec"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/cellapi"
	"cellvisor/cgroup"
	"cellvisor/runtime"
)

// slot runs one cell slot.
type slot struct {
	s       *Supervisor
	spec    runtime.Slot
	log     *zap.Logger
	outcome sync.Once

	// restartCh carries operator restarts to the slot's routine, which owns
	// the process.
	restartCh chan *restartReq
	// ctl serialises drain, undrain and restart of this slot.
	ctl sync.Mutex
	// released wakes a slot waiting for its first release.
	released chan struct{}
	// assignCh wakes the slot's routine when its pool changed.
	assignCh chan struct{}

	mu         sync.Mutex // guards the following fields
	pool       string     // "" when unassigned
	group      cgroup.Group
	api        *cellapi.Client
	state      State
	reason     string
	pid        int
	restarts   int
	lastExit   string
	readySince time.Time
	// seq is the switched release's sequence, the one the cell is to
	// serve; switchedAt when it last changed. served is the sequence the
	// running cell itself last reported serving (0: not known yet), and
	// behind when it was first found serving an older one past the grace
	// (behind.go), zero while it is not.
	seq        int64
	switchedAt time.Time
	served     int64
	behind     behindState
	drained    bool
	opRestarts []time.Time // accepted operator restarts, for the rate limit
	// opRestartsTotal counts accepted operator restarts; restarts counts
	// the crash restarts. Both, and opRestarts, outlive agent restarts
	// (saveCounters).
	opRestartsTotal int
	secSeen         int64 // refused private calls already reported
	// disk is the disk watch's latest measure (diskwatch.go).
	disk diskState
	bin  cellBin // what the running master executes (superseded.go)
	live LivenessStatus
	// preReload are the master's children before its last reload: the
	// cell has loaded the new release once none of them listens (settle.go).
	preReload []procID
	// retiring are the processes reloads of master retiringOf told to
	// finish (reloadRoom counts those still running).
	retiring   map[procID]bool
	retiringOf int
	lastHup    time.Time
	reloads    int64 // reloads sent since the agent started
	// lastApply is how the cell took its last switched release (Apply).
	lastApply *Applied
	// reloadPending is a reload asked for while the master had not
	// answered its readiness probe yet: sent once it does (onReady).
	reloadPending bool
	// answered says the running master has answered a readiness probe
	// once (or was adopted running): nginx has its signal handlers.
	answered bool
	// adopted is the running master of a previous agent, verified and
	// watched, that the slot's routine supervises instead of starting one.
	adopted *proc
	// started is the master startAll started for the slot's routine, which
	// supervises it instead of starting one. Only the routine takes it.
	started *proc
	// fresh are the limits group was just created with (Prepare or
	// createGroups), nil once a start used it: a first start with the same
	// limits need not write them again.
	fresh *cgroup.Limits
	// prepared is closed once Prepare has made the slot's group (or
	// failed to: the slot's start then tries again, and reports it); nil
	// when Prepare left the slot alone. Set before Run.
	prepared chan struct{}

	saveMu sync.Mutex // serialises saveCounters
	// unsaved says the restart count changed and is not persisted yet: an
	// immediate restart starts the new master first (saveUnsaved).
	// Only the slot's routine uses it.
	unsaved bool
	// spare is the slot's standby (standby.go), nil when it has none. Only
	// the slot's routine uses it.
	spare *spare
	// ln are the cell's listening sockets while the slot holds them
	// (listen.go), nil otherwise. Only the slot's routine uses it.
	ln *listeners
	// early are the listeners Prepare bound ahead of the slot's first
	// start, where its active release (earlySeq, -1 if unknown) listens
	// (earlyAddr); the start takes them, and Run's start pass closes any
	// it did not take. Set before Run; only that pass and the slot's
	// routine use them.
	early     *listeners
	earlyAddr string
	earlySeq  int64
	// condemned says the group's leftovers were killed (not waited for)
	// after the last exit, with the listeners held: the next start need
	// not kill them again. Only the slot's routine uses it.
	condemned bool
	// vacant says recoverAll found the slot's group absent or empty, or
	// emptied it, and nothing has started in it since: a start of the
	// agent's first pass (startAll) need not look for leftovers. Set and
	// cleared before the routines run.
	vacant bool
}

// restartReq is an operator restart; done receives nil once the new cell is
// ready, or why the restart failed.
type restartReq struct {
	done chan error
	kind restartKind
}

func newSlot(s *Supervisor, spec runtime.Slot, pool string) *slot {
	c := &slot{
		s: s, spec: spec, pool: pool, state: StateStopped,
		log:       s.log.With(zap.String("cell", spec.Name)),
		restartCh: make(chan *restartReq),
		released:  make(chan struct{}, 1),
		assignCh:  make(chan struct{}, 1),
		drained:   spec.Drained(),
	}
	c.loadCounters()
	return c
}

// proc is one cell master: started by this agent (cmd, reaped by Wait), or
// adopted from a previous one (watched through a pidfd, not our child).
type proc struct {
	cmd     *exec.Cmd // nil when adopted
	pid     int
	done    chan struct{}
	err     error // valid once done is closed
	started time.Time
	logs    logMark // where the cell's logs ended at its start
	adopted bool
	group   cgroup.Group // the cgroup it was started in; nil when adopted

	mu    sync.Mutex // guards pidfd
	pidfd *os.File   // an adopted master's, on the poller; nil once its watch ended
}

// firstOutcome counts this slot towards the supervisor's Ready once.
func (c *slot) firstOutcome() { c.outcome.Do(c.s.pending.Done) }

// set records a state; a ready cell of a drained slot is drained.
func (c *slot) set(st State, reason string) {
	c.mu.Lock()
	prev := c.state
	if st == StateReady && c.drained {
		st = StateDrained
	}
	c.state, c.reason = st, reason
	switch {
	case st == StateReady || st == StateDrained:
		if c.readySince.IsZero() {
			c.readySince = c.s.clk.Now()
		}
	default:
		c.readySince = time.Time{}
	}
	c.mu.Unlock()
	if prev != st {
		c.log.Info("cell state", zap.String("from", string(prev)), zap.String("to", string(st)), zap.String("reason", reason))
	}
}

func (c *slot) status() SlotStatus {
	c.mu.Lock()
	st := SlotStatus{
		Name:             c.spec.Name,
		Pool:             c.pool,
		Assignment:       Unassigned,
		State:            c.state,
		Reason:           c.reason,
		PID:              c.pid,
		HTTPPort:         c.spec.HTTPPort,
		HTTPSPort:        c.spec.HTTPSPort,
		Restarts:         c.restarts,
		OperatorRestarts: c.opRestartsTotal,
		LastExit:         c.lastExit,
		Sequence:         c.served,
		CurrentSequence:  c.seq,
		Drained:          c.drained,
		Reloads:          c.reloads,
	}
	if c.pid != 0 && c.live.Checks > 0 {
		l := c.live
		st.Liveness = &l
	}
	if c.lastApply != nil {
		a := *c.lastApply
		st.Applied = &a
	}
	if !c.readySince.IsZero() {
		t := c.readySince
		st.ReadySince = &t
	}
	g, pool := c.group, c.pool
	c.mu.Unlock()
	if pool != "" {
		st.Assignment = Assigned
		st.Limits = c.s.settings().Limits
		st.Disk = c.disk.snapshot()
	}
	if g != nil && g.Path() != "" {
		st.Cgroup, st.CgroupPaths = g.Path(), g.Paths()
		if u, err := g.Usage(); err == nil {
			st.Usage = &u
		}
		if l, err := g.Limits(); err == nil {
			st.Limits = l
		}
	}
	return st
}

// poolName is the slot's pool, "" when unassigned.
func (c *slot) poolName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pool
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
