// Package agent wires the agent together: configuration, the cgroup subtree,
// the slot topology and assignments, the standalone runtime, the supervisor,
// the admin socket and systemd. cmd/cellvisor runs it; the demo runs it
// in-process.
package agent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/activation"
	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/controlclient"
	"cellvisor/manifest"
	"cellvisor/runtime"
	"cellvisor/supervisor"
	"cellvisor/systemd"
)

// Version is set at build time.
var Version = "dev"

// AdminSocket is the admin socket path for a configuration.
func AdminSocket(c config.Agent) string { return filepath.Join(c.RunDir, "admin.sock") }

// Agent is a prepared agent, ready to Run.
type Agent struct {
	cfg     config.Agent
	log     *zap.Logger
	cg      cgroup.Manager
	sup     *supervisor.Supervisor
	admin   *supervisor.AdminServer
	limitsN string
	// act and acks are set when a manifest source is configured.
	act    *activation.Activator
	acks   *controlclient.Journal
	source manifest.Source
	// client is set on an edge enrolled with a control API; id with it.
	client     *controlclient.Client
	id         *Identity
	key        ed25519.PublicKey // pinned with id
	enrollment string
	controlErr string  // why an enrolled identity is unusable
	tasks      *ledger // control tasks that ran, until their ack is taken
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
	// Bind the admin socket first: it refuses when another agent is running,
	// before this one changes anything. Nothing is served until Run.
	admin, err := supervisor.ListenAdmin(AdminSocket(cfg), a, log.Named("admin"))
	if err != nil {
		return nil, err
	}
	a.admin = admin
	ok := false
	defer func() {
		if !ok {
			admin.Close()
		}
	}()
	topo, created, err := runtime.LoadOrCreate(runtime.Layout{
		Slots: cfg.Slots, HTTPBase: cfg.Ports.HTTPBase, HTTPSBase: cfg.Ports.HTTPSBase,
		Address: cfg.Ports.Address, StateDir: cfg.StateDir, RunDir: cfg.RunDir,
	})
	if err != nil {
		return nil, err
	}
	if created {
		log.Info("topology created", zap.Int("slots", len(topo.Slots)), zap.Int("http_base", topo.HTTPBase), zap.Int("https_base", topo.HTTPSBase))
	}
	if ports := topo.InEphemeralRange(); len(ports) > 0 {
		log.Warn("cell ports inside the kernel's ephemeral port range: an outgoing connection can take one and keep its cell from starting; choose port bases below it",
			zap.Ints("ports", ports), zap.Int("ephemeral_from", runtime.EphemeralLow()))
	}
	assign, err := runtime.LoadOrCreateAssignments(cfg.StateDir, topo)
	if err != nil {
		return nil, err
	}
	a.cg, err = cgroup.New(cgroup.Options{Root: cfg.Cgroup.Root, Subtree: cfg.Cgroup.Subtree})
	if err != nil {
		return nil, err
	}
	var refusal error
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
		if err := a.cg.PlaceSelf(l); err != nil {
			return nil, fmt.Errorf("place agent in its own leaf cgroup: %w", err)
		}
		a.limitsN = fmt.Sprintf("%s memory, %g CPU", cfg.AgentLimits.Memory, cfg.AgentLimits.CPU)
		if os.Getenv("GOMEMLIMIT") == "" {
			// Go does not read its cgroup's limit: without a soft limit of
			// its own the heap grows to twice what is live before it is
			// collected, and a large activation (a recovery snapshot near
			// its bound) meets the hard limit long before it needs to.
			debug.SetMemoryLimit(int64(cfg.AgentLimits.Memory) * 3 / 4)
		}
	}
	log.Info("cgroups", zap.String("mode", string(a.cg.Mode())), zap.String("subtree", a.cg.Path()))
	// Choose the source before anything is written: an enrolled edge
	// refuses domains_dir without touching its releases.
	if err := a.chooseSource(); err != nil {
		return nil, err
	}
	if cfg.DomainsDir != "" {
		if err := buildStandalone(cfg, topo, assign, log); err != nil {
			return nil, err
		}
	}
	rewind := verifyReleases(topo, assign, log)
	a.sup, err = supervisor.New(supervisor.Options{
		Binary:        cfg.OpenResty.Binary,
		Topology:      topo,
		Assignments:   assign,
		Cgroups:       a.cg,
		Limits:        CellLimits(cfg),
		Refusal:       refusal,
		Policy:        supervisor.Policy{Initial: cfg.Restart.InitialDelay.D(), Max: cfg.Restart.MaxDelay.D(), HealthyAfter: cfg.Restart.HealthyAfter.D()},
		ReadyTimeout:  cfg.OpenResty.ReadyTimeout.D(),
		StopTimeout:   cfg.OpenResty.StopTimeout.D(),
		ProbeHost:     probeHost(cfg.Ports.Address),
		RestartLimit:  cfg.Restart.RateLimit,
		RestartWindow: cfg.Restart.RateWindow.D(),
		DrainTimeout:  cfg.Restart.DrainTimeout.D(),
		LogBudget:     int64(cfg.Limits.Logs),
		Logger:        log,
		Version:       Version,
	})
	if err != nil {
		return nil, err
	}
	if a.source != nil {
		if err := a.setupActivation(topo, assign); err != nil {
			return nil, err
		}
		if rewind > 0 {
			if err := a.act.Rewind(rewind); err != nil {
				return nil, err
			}
		}
	}
	ok = true
	return a, nil
}

// chooseSource picks where signed manifests come from: a spool directory
// when one is configured, else the control API the edge enrolled with, else
// none (standalone, or not enrolled yet).
func (a *Agent) chooseSource() error {
	a.enrollment = EnrollmentNone
	if a.cfg.Source.Dir != "" {
		id, key, err := LoadIdentity(a.cfg.Identity())
		if err != nil {
			return err
		}
		a.enrollment, a.id, a.key = EnrollmentSpool, &id, key
		a.source = controlclient.DirSource{Dir: a.cfg.Source.Dir}
		return nil
	}
	id, key, err := a.enrolled()
	if errors.Is(err, errUnusable) {
		a.unusable(err)
		return nil
	}
	if err != nil || id == nil {
		return err
	}
	if a.cfg.DomainsDir != "" {
		return fmt.Errorf("domains_dir: this edge is enrolled with %s; its configuration comes from there, remove domains_dir", id.ControlURL)
	}
	a.id, a.key = id, key
	a.client, err = controlclient.New(controlclient.Options{URL: id.ControlURL, Dir: a.cfg.IdentityDir(), Logger: a.log})
	if err != nil {
		a.unusable(fmt.Errorf("%w: control client: %v", errUnusable, err))
		return nil
	}
	if a.tasks, err = openLedger(filepath.Join(a.cfg.StateDir, "tasks.json")); err != nil {
		// Not worth refusing to start over: at worst a task runs again.
		a.log.Error("control task ledger damaged; starting an empty one", zap.Error(err))
	}
	a.enrollment, a.source = EnrollmentEnrolled, a.client
	a.log.Info("enrolled edge", zap.String("edge", id.EdgeID), zap.String("control", id.ControlURL))
	return nil
}

// unusable records an enrolled identity that cannot be used: the cells
// still serve their verified releases from disk (a damaged identity must not
// take customer traffic down), nothing is polled, and status says why.
func (a *Agent) unusable(err error) {
	a.enrollment, a.controlErr = EnrollmentUnusable, err.Error()
	a.log.Error("enrolled identity unusable: serving the releases on disk, polling nothing; enroll again (cellvisor enroll --replace)", zap.Error(err))
}

// setupActivation prepares the ack journal and the activator.
func (a *Agent) setupActivation(topo runtime.Topology, assign runtime.Assignments) error {
	var err error
	a.acks, err = controlclient.OpenJournal(filepath.Join(a.cfg.StateDir, "acks.journal"), a.log)
	if err != nil {
		return err
	}
	a.act, err = activation.New(activation.Options{
		EdgeID: a.id.EdgeID, PublicKey: a.key, Source: a.source, Journal: a.acks,
		Topology: topo, Assignments: assign, Cells: a.sup, StateDir: a.cfg.StateDir,
		ApplyTimeout: a.cfg.Source.ApplyTimeout.D(), PollTimeout: a.cfg.Source.PollTimeout.D(), Logger: a.log,
		Render: func(s runtime.Slot, pool string, seq int64) runtime.RenderParams {
			return RenderParams(a.cfg, s, pool, seq)
		},
	})
	return err
}

// verifyReleases re-checks every assigned slot's active release before any
// cell starts: a damaged one is replaced by the newest intact older one, and
// a slot with none stays degraded. This is what lets an agent restarted with
// its control plane unreachable serve from disk, and only what is whole. It
// returns the lowest sequence a slot was rolled back to (0 if none), which
// the active sequence must go back to so that the newer one is fetched again.
func verifyReleases(topo runtime.Topology, assign runtime.Assignments, log *zap.Logger) (rewind int64) {
	for _, s := range topo.Slots {
		if assign[s.Name] == "" {
			continue
		}
		m, rolledBack, err := runtime.VerifyCurrent(s)
		switch {
		case errors.Is(err, runtime.ErrNoRelease):
		case err != nil:
			log.Error("no intact release; the cell stays degraded", zap.String("cell", s.Name), zap.Error(err))
		case rolledBack:
			log.Warn("active release was damaged; rolled back", zap.String("cell", s.Name), zap.Int64("sequence", m.Sequence))
			if rewind == 0 || m.Sequence < rewind {
				rewind = m.Sequence
			}
		}
	}
	return rewind
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

// Status reports the agent.
func (a *Agent) Status() supervisor.Status {
	st := a.sup.Status()
	a.decorate(&st)
	return st
}

// LiveStatus reports the agent with each running cell's own report.
func (a *Agent) LiveStatus(ctx context.Context) supervisor.Status {
	st := a.sup.LiveStatus(ctx)
	a.decorate(&st)
	return st
}

func (a *Agent) decorate(st *supervisor.Status) {
	st.AgentLimits = a.limitsN
	c := &supervisor.ControlStatus{Enrollment: a.enrollment, Error: a.controlErr}
	st.Control = c
	if a.id != nil {
		c.EdgeID, c.ControlURL = a.id.EdgeID, a.id.ControlURL
	}
	if a.client != nil {
		if ok, _ := a.client.LastSuccess(); !ok.IsZero() {
			c.LastSuccess = &ok
		}
	}
	if a.act == nil {
		return
	}
	at, err := a.act.LastPoll()
	c.ActiveSequence, c.PendingAcks, c.DroppedAcks = a.act.Active(), len(a.acks.Pending()), a.acks.Dropped()
	if !at.IsZero() {
		c.LastPoll = &at
	}
	if err != nil {
		c.LastPollError = err.Error()
	}
}

// Drain, Undrain and Restart control one cell (see supervisor).
func (a *Agent) Drain(ctx context.Context, cell string) (supervisor.SlotStatus, error) {
	return a.sup.Drain(ctx, cell)
}

// Undrain reverses Drain.
func (a *Agent) Undrain(ctx context.Context, cell string) (supervisor.SlotStatus, error) {
	return a.sup.Undrain(ctx, cell)
}

// Restart restarts one cell gracefully.
func (a *Agent) Restart(ctx context.Context, cell string) (supervisor.SlotStatus, error) {
	return a.sup.Restart(ctx, cell)
}

// Ready is closed once every cell had its first outcome.
func (a *Agent) Ready() <-chan struct{} { return a.sup.Ready() }

// Run runs until ctx is cancelled, then stops every cell and returns.
func (a *Agent) Run(ctx context.Context) error {
	n := systemd.New(a.log)
	adminCtx, stopAdmin := context.WithCancel(context.Background())
	adminDone := make(chan error, 1)
	go func() { adminDone <- a.admin.Serve(adminCtx) }()
	supDone := make(chan error, 1)
	go func() { supDone <- a.sup.Run(ctx) }()
	go n.Watchdog(ctx, func() bool { return true })
	var side sync.WaitGroup
	if a.act != nil {
		side.Add(2)
		go func() {
			defer side.Done()
			a.act.Run(ctx, a.cfg.Source.PollInterval.D(), a.cfg.Source.MaxBackoff.D())
		}()
		go func() {
			defer side.Done()
			a.acks.Run(ctx, a.source.Ack, a.cfg.Source.MaxBackoff.D())
		}()
	}
	if a.client != nil {
		side.Add(2)
		go func() { defer side.Done(); a.taskLoop(ctx) }()
		go func() { defer side.Done(); a.reportLoop(ctx) }()
	}
	defer side.Wait()
	select {
	case <-a.sup.Ready():
		n.Ready()
		a.log.Info("agent ready", zap.String("summary", a.summary()))
		a.reportStatus(ctx, n)
	case <-ctx.Done():
	}
	n.Stopping()
	a.log.Info("stopping cells")
	err := <-supDone
	stopAdmin()
	if aerr := <-adminDone; aerr != nil && !errors.Is(aerr, context.Canceled) {
		err = errors.Join(err, aerr)
	}
	if a.cfg.Cgroup.Subtree != "" {
		if rerr := a.cg.Remove(); rerr != nil {
			a.log.Debug("remove cgroup subtree", zap.Error(rerr))
		}
	}
	return err
}

// reportStatus keeps systemd's one-line STATUS= current until ctx ends.
func (a *Agent) reportStatus(ctx context.Context, n *systemd.Notifier) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	last := ""
	for {
		if s := a.summary(); s != last {
			n.Status(s)
			last = s
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) summary() string {
	st := a.sup.Status()
	counts := map[supervisor.State]int{}
	for _, s := range st.Slots {
		counts[s.State]++
	}
	return fmt.Sprintf("%d slots: %d ready, %d drained, %d degraded, %d stopped; cgroups %s",
		len(st.Slots), counts[supervisor.StateReady], counts[supervisor.StateDrained], counts[supervisor.StateDegraded], counts[supervisor.StateStopped], st.CgroupMode)
}

// buildStandalone compiles the local domains directory into a release for
// every assigned slot and switches to it if its content changed. A bad
// domains directory refuses to start, naming the file.
func buildStandalone(cfg config.Agent, topo runtime.Topology, assign runtime.Assignments, log *zap.Logger) error {
	domains, err := runtime.LoadDomainsDir(cfg.DomainsDir)
	if err != nil {
		return fmt.Errorf("domains_dir %s: %w", cfg.DomainsDir, err)
	}
	pools, err := runtime.CompilePools(domains)
	if err != nil {
		return err
	}
	for _, s := range topo.Slots {
		pool := assign[s.Name]
		if pool == "" {
			continue
		}
		var seq int64 = 1
		if cur, err := runtime.Current(s); err == nil {
			seq = cur.Sequence + 1
		}
		r, err := runtime.BuildRelease(RenderParams(cfg, s, pool, seq), pools[pool])
		if err != nil {
			return err
		}
		meta, changed, err := runtime.Activate(s, r)
		if err != nil {
			return err
		}
		if changed {
			log.Info("release activated", zap.String("cell", s.Name), zap.String("pool", pool), zap.Int64("sequence", meta.Sequence))
		}
	}
	return nil
}

// RenderParams are the render inputs for a slot from the configuration.
func RenderParams(cfg config.Agent, s runtime.Slot, pool string, seq int64) runtime.RenderParams {
	p := runtime.RenderParams{
		Slot:                  s,
		Pool:                  pool,
		Sequence:              seq,
		Address:               cfg.Ports.Address,
		Modules:               cfg.OpenResty.Modules,
		WorkerConnections:     cfg.OpenResty.WorkerConnections,
		WorkerShutdownTimeout: int(cfg.OpenResty.WorkerShutdownTimeout.D().Seconds()),
		CacheMaxBytes:         int64(cfg.Limits.Cache),
		RequestMaxBytes:       int64(cfg.Limits.RequestTmp),
	}
	if os.Geteuid() == 0 {
		// Cells run as the agent's user; as root that needs saying, or
		// nginx would switch its workers to nobody.
		if u, err := user.Current(); err == nil {
			p.User = u.Username + " " + groupName(u)
		}
	}
	return p
}

func groupName(u *user.User) string {
	if g, err := user.LookupGroupId(u.Gid); err == nil {
		return g.Name
	}
	return strings.TrimSpace(u.Gid)
}
