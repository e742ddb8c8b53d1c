// Package agent wires the agent together: configuration, the cgroup subtree,
// the slot topology and assignments, the standalone runtime, the supervisor,
// the admin socket and systemd. cmd/cellvisor runs it; the demo runs the
// agent binary as a child process and links none of it.
package agent

import (
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"cellvisor/activation"
	"cellvisor/adminsock"
	"cellvisor/agentmetrics"
	"cellvisor/cgexec"
	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/controlclient"
	"cellvisor/internal/celluser"
	"cellvisor/manifest"
	"cellvisor/runtime"
	"cellvisor/supervisor"
)

// Version is set at build time.
var Version = "dev"

// AdminSocket is the admin socket path for a configuration.
func AdminSocket(c config.Agent) string { return filepath.Join(c.RunDir, "admin.sock") }

// Agent is a prepared agent, ready to Run.
type Agent struct {
	cfg config.Agent
	log *zap.Logger
	cg  cgroup.Manager
	// locks hold the state directory and the cgroup subtree for this
	// agent; Run releases them when it returns.
	locks []io.Closer
	sup   *supervisor.Supervisor
	admin *adminsock.Server
	// users are the slots' own users the cells run as (nil: the agent's).
	users   map[string]*celluser.User
	limitsN string
	// act and acks are set when a manifest source is configured.
	act    *activation.Activator
	acks   *controlclient.Journal
	source manifest.Source
	// client is set on an edge enrolled with a control API; id with it.
	client *controlclient.Client
	id     *Identity
	key    ed25519.PublicKey // pinned with id
	// encKey opens the certificates' keys sealed to this edge; nil when
	// there is none.
	encKey     *ecdh.PrivateKey
	enrollment string
	controlErr string  // why an enrolled identity is unusable
	tasks      *ledger // control tasks that ran, until their ack is taken
	egress     *egressPath
	// scope is the cells' systemd scope, or nil where they live in the
	// agent's own cgroup.
	scope *cellScope
	// explicitStop is set by Shutdown (cellvisor shutdown): the cells stop
	// whatever systemd's job is.
	explicitStop atomic.Bool
	// end ends Run as its context would (Shutdown); set by Run.
	end atomic.Pointer[context.CancelFunc]
	// selfLimits are the agent leaf's limits, its CPU quota applied once the
	// cells have started (nil where the agent has no leaf).
	selfLimits *cgroup.Limits
	// metrics serves /metrics; nil when metrics.listen is empty.
	metrics *agentmetrics.Server
	// fd is the front-door fetch's state; rtt the last status report's
	// round trip to the control API, in microseconds.
	fd  frontDoors
	rtt atomic.Int64
}

// CellLimits converts the configured per-cell limits.
func CellLimits(c config.Agent) cgroup.Limits {
	q, p := cgroup.CPULimits(c.Limits.CPU)
	// Burst of one period's quota: a cell that idled restarts on the credit
	// it saved, instead of being throttled in the middle of its start-up; its
	// average stays within the quota.
	return cgroup.Limits{MemoryBytes: int64(c.Limits.Memory), CPUQuotaUS: q, CPUPeriodUS: p, PIDs: c.Limits.PIDs, CPUBurstUS: uint64(q)}
}

// New prepares the agent: it detects cgroups, places itself in its leaf,
// loads or creates the topology and assignments, builds the standalone
// runtime and binds the admin socket. Any error means nothing was started.
func New(cfg config.Agent, log *zap.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: log}
	for _, d := range []string{cfg.StateDir, cfg.RunDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	// Take the state directory, then bind the admin socket: each refuses
	// when another agent is running, before this one changes anything.
	// Nothing is served until Run.
	lock, err := lockState(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	a.locks = append(a.locks, lock)
	go warmProcessStart()
	ok := false
	defer func() {
		if !ok {
			a.unlock()
			a.closeScope()
		}
	}()
	// The cgroups (and, under systemd, the cells' scope: calls on the
	// system bus) are set up while the admin socket is bound and the layout
	// loaded: none of them needs another, and the agent's start is serial
	// until its first cell while a second CPU idles.
	var cgroups sync.WaitGroup
	var refusal, cgErr error
	cgroups.Go(func() { refusal, cgErr = a.setupCgroups() })
	defer cgroups.Wait() // before the deferred unlock: setupCgroups takes a lock
	admin, err := adminsock.Listen(AdminSocket(cfg), a, log.Named("admin"))
	if err != nil {
		return nil, err
	}
	a.admin = admin
	defer func() {
		if !ok {
			admin.Close()
		}
	}()
	topo, assign, err := loadLayout(cfg, log)
	if err != nil {
		return nil, err
	}
	users, usersNote, err := cellUsers(cfg, topo, log)
	if err != nil {
		return nil, err
	}
	cgroups.Wait()
	if cgErr != nil {
		return nil, cgErr
	}
	if sg, ok := a.cg.(cgroup.Signaller); ok && users != nil {
		// A non-root agent signals a cell of its own user as that user.
		sg.SignalAs(func(group string, send func() error) error { return celluser.Do(users[group], send) })
	}
	o := supervisorOptions(cfg, topo, assign, a.cg, refusal, log, func() { a.weighStart(startedWeight) })
	o.Users, o.UsersNote = users, usersNote
	a.users = users
	if a.sup, err = supervisor.New(o); err != nil {
		return nil, err
	}
	// The cells' groups are made while the releases are built and checked,
	// on the CPU this serial start-up leaves idle; their ports are bound
	// once the releases are (BindEarly, below).
	a.sup.PrepareGroups()
	defer func() {
		if !ok {
			a.sup.Unprepare()
		}
	}()
	// Choose the source before anything is written: an enrolled edge
	// refuses domains_dir without touching its releases.
	if err := a.chooseSource(); err != nil {
		return nil, err
	}
	// Verified first: a standalone agent builds only where the verified
	// release differs from its domains directory, or is damaged beyond
	// rollback.
	active, rewind := verifyReleases(topo, assign, cfg.DomainsDir != "", log)
	if cfg.DomainsDir != "" {
		if err := buildStandalone(cfg, topo, assign, active, log); err != nil {
			return nil, err
		}
	}
	if a.source != nil {
		a.sup.ExpectReleases()
		if err := a.setupActivation(topo, assign); err != nil {
			return nil, err
		}
		if rewind >= 0 {
			if err := a.act.Rewind(rewind); err != nil {
				return nil, err
			}
		}
	}
	if err := a.setupEgress(); err != nil {
		return nil, err
	}
	if err := a.setupMetrics(topo); err != nil {
		return nil, err
	}
	// Where each active release listens is known now, verified, without
	// reading its nginx.conf (runtime.ReleaseMeta.Listen).
	a.sup.BindEarly()
	ok = true
	return a, nil
}

// probeHost is the loopback address that reaches listeners bound to addr.
func probeHost(addr string) string {
	switch addr {
	case "", "0.0.0.0":
		return "127.0.0.1"
	case "::":
		return "::1"
	}
	return addr
}

// loadLayout loads the slot topology and assignments, or creates them on a
// new host.
func loadLayout(cfg config.Agent, log *zap.Logger) (runtime.Topology, runtime.Assignments, error) {
	topo, created, err := runtime.LoadOrCreate(runtime.Layout{
		Slots: cfg.Slots, HTTPBase: cfg.Ports.HTTPBase, HTTPSBase: cfg.Ports.HTTPSBase,
		Address: cfg.Ports.Address, StateDir: cfg.StateDir, RunDir: cfg.RunDir,
	})
	if err != nil {
		return runtime.Topology{}, nil, err
	}
	if created {
		log.Info("topology created", zap.Int("slots", len(topo.Slots)), zap.Int("http_base", topo.HTTPBase), zap.Int("https_base", topo.HTTPSBase))
	}
	if ports := topo.InEphemeralRange(); len(ports) > 0 {
		log.Warn("cell ports inside the kernel's ephemeral port range: an outgoing connection can take one and keep its cell from starting; choose port bases below it",
			zap.Ints("ports", ports), zap.Int("ephemeral_from", runtime.EphemeralLow()))
	}
	assign, err := runtime.LoadOrCreateAssignments(cfg.StateDir, topo)
	return topo, assign, err
}

// cellUsers resolves the users the cells run as (cell_users) and gives
// each slot's directories to its user's group, or says why the cells run
// as the agent's user: what a cell could then reach.
func cellUsers(cfg config.Agent, topo runtime.Topology, log *zap.Logger) (map[string]*celluser.User, string, error) {
	names := make([]string, 0, len(topo.Slots))
	for _, s := range topo.Slots {
		names = append(names, s.Name)
	}
	users, why, err := celluser.Resolve(cfg.CellUsersMode(), names, celluser.Real{})
	if err != nil {
		return nil, "", err
	}
	if users != nil {
		if err := celluser.Reachable(cfg.StateDir, cfg.RunDir); err != nil {
			if cfg.CellUsersMode() == "slot" {
				return nil, "", fmt.Errorf("%w: %v", celluser.ErrUnavailable, err)
			}
			users, why = nil, err.Error()
		}
	}
	gids := map[string]int{}
	for name, u := range users {
		gids[name] = int(u.GID)
	}
	if err := topo.Own(cfg.StateDir, cfg.RunDir, gids); err != nil {
		return nil, "", fmt.Errorf("give the slots' directories to their users: %w", err)
	}
	switch {
	case users != nil:
		log.Info("cells run as their slots' own users", zap.String("first", users[names[0]].Name))
	case why != "":
		log.Warn("cells run as the agent's user: a cell can read the other cells' secrets and files and reach the agent's admin socket; "+why,
			zap.String("cell_users", cfg.CellUsersMode()))
	}
	return users, why, nil
}

// setupCgroups detects the cgroup subtree and places the agent in its own
// leaf with its limits. It returns why cells must not start (limits that
// must be enforced cannot be), or nil.
func (a *Agent) setupCgroups() (refusal error, err error) {
	cfg, log := a.cfg, a.log
	if a.scope, err = a.setupScope(); err != nil {
		return nil, err
	}
	o := cgroup.Options{Root: cfg.Cgroup.Root, Subtree: cfg.Cgroup.Subtree}
	if a.scope != nil {
		o.Cells = a.scope.scope.ControlGroup
	}
	a.cg, err = cgroup.New(o)
	if err != nil {
		return nil, err
	}
	if a.scope != nil && a.cg.Mode() == cgroup.ModeUnenforced && cfg.ScopeMode() == config.ScopeAuto {
		// A scope not handed to this user (no prepare-cgroups step): the
		// cells are better off limited in the agent's cgroup.
		log.Warn("the cells' systemd scope is unusable: the cells stay in the agent's unit and a restart of the unit stops them",
			zap.String("scope", a.scope.scope.Name), zap.NamedError("reason", a.cg.Reason()))
		a.closeScope()
		a.scope, o.Cells = nil, ""
		if a.cg, err = cgroup.New(o); err != nil {
			return nil, err
		}
	}
	// Another agent on the same subtree (with other state and run
	// directories) would kill these cells as strays, and this one its.
	cgLock, err := a.cg.Lock()
	if err != nil {
		return nil, err
	}
	a.locks = append(a.locks, cgLock)
	if a.cg.Mode() == cgroup.ModeUnenforced {
		if cfg.Enforced() {
			refusal = fmt.Errorf("cell limits cannot be enforced (%v); set limits.enforce: false to run cells without limits", a.cg.Reason())
			log.Error("refusing to start cells", zap.Error(refusal))
		} else {
			log.Warn("running cells WITHOUT resource limits (limits.enforce is false)", zap.NamedError("reason", a.cg.Reason()))
		}
	} else if cfg.AgentPlaced() {
		q, p := cgroup.CPULimits(cfg.AgentLimits.CPU)
		l := cgroup.Limits{MemoryBytes: int64(cfg.AgentLimits.Memory), CPUQuotaUS: q, CPUPeriodUS: p}
		// The CPU quota waits until every cell has had its first outcome
		// (Run applies it): the agent's start (Go runtime, 8 cells' exec
		// helpers, probes: 26–41 ms of CPU) exceeds one period's 25 ms, and
		// a throttled agent left every cell's start waiting for the next
		// period. The memory limit applies once the agent is in its leaf:
		// at once on v2, and with the quota on v1 (cgroup.MoveSelf says
		// why).
		start := l
		start.CPUQuotaUS = -1
		a.selfLimits = &l
		if err := a.cg.PrepareSelf(start); err != nil {
			return nil, fmt.Errorf("place agent in its own leaf cgroup: %w", err)
		}
		a.weighStart(startWeight)
		a.limitsN = fmt.Sprintf("%s memory, %g CPU", cfg.AgentLimits.Memory, cfg.AgentLimits.CPU)
		if os.Getenv("GOMEMLIMIT") == "" {
			// Go does not read its cgroup's limit: without a soft limit of
			// its own the heap grows to twice what is live before it is
			// collected, and a large activation (a recovery snapshot near
			// its bound) meets the hard limit long before it needs to.
			debug.SetMemoryLimit(int64(cfg.AgentLimits.Memory) * 3 / 4)
		}
	}
	fields := []zap.Field{zap.String("mode", string(a.cg.Mode())), zap.String("subtree", a.cg.Path())}
	if a.cg.Mode() == cgroup.ModeV2 {
		// clone3 into the cell's cgroup, or (where a seccomp filter such
		// as systemd's RestrictNamespaces= refuses clone3) the join helper.
		start := "clone3"
		if cgroup.JoinsCells(a.cg) {
			start = "join helper (clone3 refused)"
		}
		fields = append(fields, zap.String("cell_start", start))
	}
	if cgroup.JoinsCells(a.cg) {
		// How cells join their groups: the helper built into this
		// binary, or the slower shell (a build without cgexec.LDFlags).
		helper := "built-in"
		if !cgexec.Builtin() {
			helper = "shell"
		}
		fields = append(fields, zap.String("join_helper", helper))
	}
	log.Info("cgroups", fields...)
	return refusal, nil
}

// The agent's CPU weight against its cells while they start: ahead of them
// until it has exec'd every one (each start waits on the agent), behind
// them until each has had its first outcome (then the agent's bookkeeping
// waits on nothing but them), and level with them after, when its quota
// applies too (limitSelf). The weights decide only who runs first when
// both want the CPU; the quotas still cap both. The start's two weights
// apply on v2 only, where the agent is in its leaf while its cells start;
// on v1 it moves in after (cgroup.MoveSelf says why).
const (
	startWeight   = 10 * cgroup.DefaultWeight
	startedWeight = cgroup.DefaultWeight / 10
)

// weighStart sets one of the start's weights, where the agent is in its
// leaf while its cells start.
func (a *Agent) weighStart(w int) {
	if a.cg.Mode() == cgroup.ModeV2 {
		a.weighSelf(w)
	}
}

// weighSelf sets the agent's CPU weight, where it has a leaf of its own.
func (a *Agent) weighSelf(w int) {
	if a.selfLimits == nil {
		return
	}
	if err := a.cg.WeighSelf(w); err != nil {
		a.log.Warn("set the agent's CPU weight", zap.Int("weight", w), zap.Error(err))
		return
	}
	a.log.Debug("agent CPU weight", zap.Int("weight", w))
}

// supervisorOptions configures the supervisor from the configuration.
func supervisorOptions(cfg config.Agent, topo runtime.Topology, assign runtime.Assignments, cg cgroup.Manager, refusal error, log *zap.Logger, started func()) supervisor.Options {
	return supervisor.Options{
		Binary:         cfg.OpenResty.Binary,
		Watch:          cfg.OpenResty.Modules,
		RuntimeUpgrade: supervisor.UpgradePolicy(cfg.RuntimeUpgrade),
		Topology:       topo,
		Assignments:    assign,
		Cgroups:        cg,
		Limits:         CellLimits(cfg),
		Refusal:        refusal,
		Policy:         supervisor.Policy{Initial: cfg.Restart.InitialDelay.D(), Max: cfg.Restart.MaxDelay.D(), HealthyAfter: cfg.Restart.HealthyAfter.D()},
		ReadyTimeout:   cfg.OpenResty.ReadyTimeout.D(),
		StopTimeout:    cfg.OpenResty.StopTimeout.D(),
		ProbeHost:      probeHost(cfg.Ports.Address),
		Started:        started,
		RestartLimit:   cfg.Restart.RateLimit,
		RestartWindow:  cfg.Restart.RateWindow.D(),
		DrainTimeout:   cfg.Restart.DrainTimeout.D(),
		Liveness:       livenessPolicy(cfg.Liveness),
		LogBudget:      int64(cfg.Limits.Logs),
		CacheBudget:    int64(cfg.Limits.Cache),
		RequestBudget:  int64(cfg.Limits.RequestTmp),
		Logger:         log,
		Version:        Version,

		RuntimeUpgradePace: cfg.RuntimeUpgradePace.D(),
	}
}

// livenessPolicy converts the configured liveness checks (interval 0: off).
func livenessPolicy(l config.Liveness) supervisor.LivenessPolicy {
	p := supervisor.LivenessPolicy{Interval: l.Interval.D(), Timeout: l.Timeout.D(),
		FailureThreshold: l.FailureThreshold, RestartThreshold: l.RestartThreshold}
	if p.Interval == 0 {
		p.Interval = -1
	}
	return p
}

// warmProcessStart has the os package check, on a goroutine of its own,
// whether pidfds work here. It checks once per process, the first time a
// process is started or found, by cloning a child and waiting for it to
// exit: otherwise the first cell's start pays that (1-5 ms on a busy host,
// the start pass waiting), while here the agent's serial set-up leaves a
// CPU free for it.
func warmProcessStart() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Release()
	}
}
