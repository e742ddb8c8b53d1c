// Package supervisor is the agent's core: it runs one goroutine per cell slot
// that starts the slot's OpenResty inside its cgroup (or adopts the one a
// previous agent left running, once verified as that slot's), waits for its
// listener, reaps or watches it, kills whatever it leaves behind and restarts
// it with bounded backoff; it reports every slot's state, which adminsock
// serves on the local admin socket. Deciding (the restart tracker, the state
// of a slot) is kept apart from doing (processes, cgroups) so the first can
// be tested fast. adminsock, agent, agentmetrics, cmd/cellvisor and
// cmd/cellvisor-demo import it.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"cellvisor/cgroup"
	"cellvisor/internal/celluser"
	"cellvisor/internal/clock"
	"cellvisor/logbound"
	"cellvisor/runtime"
)

// Options configures a Supervisor.
type Options struct {
	// Binary is the OpenResty executable. Required; it must exist.
	Binary string
	// Watch are more files the cells' runtime loads (dynamic modules): a
	// change of one has the binary verified again (upgrade.go); nil for
	// none.
	Watch []string
	// Topology and Assignments describe the slots. Required.
	Topology    runtime.Topology
	Assignments runtime.Assignments
	// Cgroups is the agent's cgroup subtree. Required.
	Cgroups cgroup.Manager
	// Limits are every cell's limits.
	Limits cgroup.Limits
	// Refusal, when not nil, keeps every cell stopped and says why (limits that
	// must be enforced cannot be).
	Refusal error
	// Policy is the restart backoff.
	Policy Policy
	// ReadyTimeout bounds the wait for a started cell to answer its readiness
	// probe; zero means 10s.
	ReadyTimeout time.Duration
	// StopTimeout is the graceful-stop grace period; zero means 10s.
	StopTimeout time.Duration
	// ProbeHost is the host the readiness probe dials; "" means 127.0.0.1.
	ProbeHost string
	// Started, when not nil, is called once Run has exec'd the cells it
	// starts at once, before they are ready.
	Started func()
	// Logger, or nil for none.
	Logger *zap.Logger
	// Version is reported in status.
	Version string
	// Jitter returns values in [0,1) for restart jitter, or nil for math/rand.
	Jitter func() float64
	// Clock times restarts, readiness and rate limits, or nil for the real
	// clock.
	Clock clock.Clock
	// RestartLimit operator restarts per cell in any RestartWindow; zero
	// means 3 in 10 minutes.
	RestartLimit  int
	RestartWindow time.Duration
	// DrainTimeout bounds the wait for requests in flight when restarting;
	// zero means 30s.
	DrainTimeout time.Duration
	// LogBudget is the most bytes a cell's logs directory may hold; zero
	// means 16 MiB.
	LogBudget int64
	// CacheBudget and RequestBudget are limits.cache and
	// limits.request_tmp, which the disk watch reports use against; zero
	// means 256 MiB and 64 MiB. The cells' releases carry the settings
	// that keep them (runtime.CacheTarget).
	CacheBudget, RequestBudget int64
	// MonitorInterval is how often cells' own status is read to report
	// security events; zero means 10s.
	MonitorInterval time.Duration
	// Liveness is how ready cells are checked for hanging; zero values
	// take its defaults.
	Liveness LivenessPolicy
	// RuntimeUpgrade is how cells reach a new binary; "" means
	// UpgradeAuto.
	RuntimeUpgrade UpgradePolicy
	// RuntimeUpgradePace is the pace of UpgradePaced; zero means
	// DefaultUpgradePace.
	RuntimeUpgradePace time.Duration
	// Users are the slots' own users by slot name (celluser), or nil:
	// the cells run as the agent's user, and UsersNote says why.
	Users     map[string]*celluser.User
	UsersNote string
}

// Supervisor runs the cells.
type Supervisor struct {
	o       Options
	log     *zap.Logger
	clk     clock.Clock
	started time.Time
	slots   []*slot

	readyOnce sync.Once
	ready     chan struct{}
	pending   sync.WaitGroup
	beat      atomic.Int64 // the monitor loop's latest turn, unix ns (Heartbeat)
	// binary is Options.Binary with its links resolved, as /proc/<pid>/exe
	// names it.
	binary string
	// leave makes Run return leaving the cells running, for the next
	// supervisor to adopt: what a killed agent leaves (tests of adoption).
	leave atomic.Bool
	// live are the settings that may change while cells run (Update); the
	// same fields of o are only their initial values.
	live atomic.Pointer[Settings]
	// expect says a manifest source delivers the releases (ExpectReleases).
	expect atomic.Bool
	// bin is the file at binary as last observed (superseded.go); kick
	// wakes the runtime routine that looks at it.
	bin  atomic.Pointer[binInfo]
	kick chan struct{}

	upMu sync.Mutex   // guards up
	up   upgradeState // the last roll onto a new binary (upgrade.go)
	// forceRoll has the runtime routine roll whatever the policy and a
	// refusal of the same file before (UpgradeRuntime).
	forceRoll atomic.Bool
}

// New validates options and prepares the slots; it starts nothing.
func New(o Options) (*Supervisor, error) {
	if o.Cgroups == nil {
		return nil, errors.New("supervisor: Cgroups is required")
	}
	if len(o.Topology.Slots) == 0 {
		return nil, errors.New("supervisor: topology has no slots")
	}
	if err := checkBinary(o.Binary); err != nil {
		return nil, err
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 10 * time.Second
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 10 * time.Second
	}
	if o.ProbeHost == "" {
		o.ProbeHost = "127.0.0.1"
	}
	if o.LogBudget == 0 {
		o.LogBudget = 16 << 20
	}
	if o.CacheBudget == 0 {
		o.CacheBudget = 256 << 20
	}
	if o.RequestBudget == 0 {
		o.RequestBudget = 64 << 20
	}
	if o.MonitorInterval == 0 {
		o.MonitorInterval = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	s := &Supervisor{o: o, log: o.Logger.Named("supervisor"), clk: clock.Or(o.Clock), ready: make(chan struct{}), binary: o.Binary,
		kick: make(chan struct{}, 1)}
	live := Settings{Limits: o.Limits, Policy: o.Policy, Liveness: o.Liveness, RestartLimit: o.RestartLimit,
		RestartWindow: o.RestartWindow, DrainTimeout: o.DrainTimeout, RuntimeUpgrade: o.RuntimeUpgrade,
		RuntimeUpgradePace: o.RuntimeUpgradePace}.withDefaults()
	s.live.Store(&live)
	if resolved, err := filepath.EvalSymlinks(o.Binary); err == nil {
		s.binary = resolved
	}
	s.observeBinary()
	for _, spec := range o.Topology.Slots {
		s.slots = append(s.slots, newSlot(s, spec, o.Assignments[spec.Name]))
	}
	return s, nil
}

// ErrBinary marks a missing or unusable OpenResty binary.
var ErrBinary = errors.New("openresty binary unusable")

func checkBinary(path string) error {
	if path == "" {
		return fmt.Errorf("%w: no path configured (openresty.binary)", ErrBinary)
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: openresty.binary %s: %v", ErrBinary, path, err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%w: openresty.binary %s is not an executable file", ErrBinary, path)
	}
	return nil
}

// ExpectReleases says a manifest source delivers the releases: an assigned
// slot that has never had one waits for it (StateWaiting) rather than
// being degraded. Call it before Run.
func (s *Supervisor) ExpectReleases() { s.expect.Store(true) }

// Ready is closed once every slot has had its first outcome: its cell is
// ready, failed its first start, or is not to be run.
func (s *Supervisor) Ready() <-chan struct{} { return s.ready }

// Run adopts the cells a previous agent left running (and stops what it
// cannot verify as its own), runs every slot until ctx is cancelled, then
// stops every cell gracefully and removes their cgroups. It returns once no
// cell process is left.
func (s *Supervisor) Run(ctx context.Context) error {
	// The log budgets are made before anything starts: one refused returns
	// with no cell started, no routine left running and nothing Prepare
	// made left behind (issue 33: it returned with the cells running).
	budgets := make([]*logbound.Bound, len(s.slots))
	for i, c := range s.slots {
		if s.o.Refusal != nil {
			break
		}
		b, err := logbound.New(logbound.Options{Dir: c.spec.LogsDir(), Budget: s.o.LogBudget, Reopen: c.reopenLogs, Logger: c.log})
		if err != nil {
			s.Unprepare()
			return fmt.Errorf("log budget of %s: %w", c.spec.Name, err)
		}
		budgets[i] = b
	}
	s.started = s.clk.Now()
	s.recoverAll(ctx)
	s.startAll(s.startingSlots())
	if s.o.Started != nil {
		s.o.Started()
	}
	s.pending.Add(len(s.slots))
	// wg is every routine of the slots', and the one that closes ready
	// (done at the latest when the slots' are: each has an outcome then).
	var wg sync.WaitGroup
	wg.Go(func() {
		s.pending.Wait()
		s.readyOnce.Do(func() { close(s.ready) })
	})
	for _, c := range s.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(ctx)
		}()
	}
	side, stopSide := context.WithCancel(context.Background())
	var sideWG sync.WaitGroup
	sideWG.Add(1)
	go func() { defer sideWG.Done(); s.monitor(side) }()
	sideWG.Go(func() { s.runtimeLoop(ctx) })
	for i, c := range s.slots {
		b := budgets[i]
		if b == nil {
			continue
		}
		sideWG.Go(func() { c.watchDisk(side) })
		sideWG.Add(1)
		go func() {
			defer sideWG.Done()
			// The budget is first enforced once every slot has had its
			// first outcome: its watch wakes on every write of a starting
			// cell, and a start writes little.
			select {
			case <-s.ready:
			case <-side.Done():
				return
			}
			if err := b.Run(side); err != nil {
				c.log.Error("log budget", zap.Error(err))
			}
		}()
	}
	wg.Wait()
	stopSide()
	sideWG.Wait()
	if s.leave.Load() {
		s.log.Info("left the cells running")
		return nil
	}
	var errs []error
	for _, c := range s.slots {
		c.closeClient()
		if err := c.removeGroup(); err != nil {
			errs = append(errs, err)
		}
	}
	s.log.Info("all cells stopped")
	return errors.Join(errs...)
}

// LeaveRunning makes Run return, once its context ends, with every cell left
// running for the next agent to adopt (a restart of the agent under systemd,
// its cells in a scope of their own). Call it before the context ends.
func (s *Supervisor) LeaveRunning() { s.leave.Store(true) }

// LeftRunning reports whether LeaveRunning was called.
func (s *Supervisor) LeftRunning() bool { return s.leave.Load() }

// Status reports the agent and every slot.
func (s *Supervisor) Status() Status {
	st := Status{
		Version:    s.o.Version,
		PID:        os.Getpid(),
		StartedAt:  s.started,
		CgroupMode: s.o.Cgroups.Mode(),
		CgroupPath: s.o.Cgroups.Path(),
		Enforced:   s.o.Cgroups.Mode() != cgroup.ModeUnenforced,
		CellUsers:  "slot",
	}
	if s.o.Users == nil {
		st.CellUsers = "agent"
		if s.o.UsersNote != "" {
			st.CellUsers += ": " + s.o.UsersNote
		}
	}
	if s.o.Refusal != nil {
		st.Refusal = s.o.Refusal.Error()
	} else if r := s.o.Cgroups.Reason(); r != nil {
		st.Refusal = "limits not enforced (limits.enforce is false): " + r.Error()
	}
	cur := s.observeBinary()
	up := s.upgrade()
	st.Runtime = &RuntimeStatus{Binary: s.o.Binary, Upgrade: up.state, Reason: up.err}
	if cur != nil {
		st.Runtime.Version = cur.Version
	}
	for _, c := range s.slots {
		ss := c.status()
		if ss.Runtime = c.runtimeStatus(cur); ss.Runtime != nil && ss.Runtime.Superseded {
			st.Runtime.Superseded++
		}
		st.Slots = append(st.Slots, ss)
	}
	return st
}

// StateCounts counts the slots in each state: the summary systemd and the
// log show, without Status's reads of every cell's cgroup usage and limits
// (about ten control files a cell).
func (s *Supervisor) StateCounts() map[State]int {
	n := map[State]int{}
	for _, c := range s.slots {
		c.mu.Lock()
		n[c.state]++
		c.mu.Unlock()
	}
	return n
}

// Serving counts the assigned slots and, of them, the ready and drained
// ones, and gives the first not-ready assigned slot's name and reason: what
// the agent's one-line summary and its "no cell serving" alarm read.
func (s *Supervisor) Serving() (assigned, ready, drained int, first, reason string) {
	for _, c := range s.slots {
		c.mu.Lock()
		if c.pool != "" {
			assigned++
			switch c.state {
			case StateReady:
				ready++
			case StateDrained:
				drained++
			default:
				if first == "" {
					first, reason = c.spec.Name, c.reason
				}
			}
		}
		c.mu.Unlock()
	}
	return assigned, ready, drained, first, reason
}

// LiveStatus is Status with each running cell's own report.
func (s *Supervisor) LiveStatus(ctx context.Context) Status {
	st := s.Status()
	s.liveStatus(ctx, &st)
	return st
}
