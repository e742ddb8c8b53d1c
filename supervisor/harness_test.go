package supervisor_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"cellvisor/agent"
	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/domain"
	"cellvisor/internal/celluser"
	"cellvisor/runtime"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

const testHost = "app.cellvisor.test"

// harness is a supervisor running real cells.
type harness struct {
	t      testing.TB
	bin    string
	ctx    context.Context
	sup    *supervisor.Supervisor
	cg     cgroup.Manager
	topo   runtime.Topology
	cancel context.CancelFunc
	done   chan error
	opts   supervisor.Options
	cfg    config.Agent // what the releases were rendered from
	// keys are the domains' opened certificate keys every release carries.
	keys map[string][]byte
}

type harnessOpts struct {
	slots int
	// sequence is the release sequence the cells start with; 0 means 1.
	sequence int64
	assign   runtime.Assignments
	cg       cgroup.Manager // nil: a fresh real subtree
	binary   string         // "": the host's OpenResty
	policy   supervisor.Policy
	refusal  error
	ready    time.Duration   // ready timeout; 0 means 10s
	domains  []domain.Domain // nil: one static domain in shared-default
	drain    time.Duration   // drain timeout of operator restarts; 0 means 30s
	monitor  time.Duration   // monitor interval; 0 means 10s
	limit    int             // operator restarts per window; 0 means 3
	// liveness is the liveness policy; zero values take the defaults.
	liveness supervisor.LivenessPolicy
	// upgrade is the runtime upgrade policy; "" means auto.
	upgrade supervisor.UpgradePolicy
	// pace is the paced policy's pace; zero means its default.
	pace time.Duration
	// modules are the dynamic modules the cells load (and the supervisor
	// watches); nil: the host's.
	modules []string
	// authWindow is the private endpoint's timestamp window in seconds;
	// 0 means the shipped one.
	authWindow int
	// workerConns is each cell's worker_connections; 0 means the shipped one.
	workerConns int
	// limits are every pool's limits (the signed assignments' policy).
	limits runtime.PoolLimits
	// users are the slots' own users (celluser); nil: the cells run as
	// the test's user.
	users map[string]*celluser.User
	// resolvers are the cells' DNS servers (openresty.resolvers); caFile
	// the bundle https origins are verified against ("": the default).
	resolvers []string
	caFile    string
	// exposeCell is openresty.expose_cell.
	exposeCell bool
	// cacheBudget and bodyBudget are the cells' limits.cache and
	// limits.request_tmp; 0 means the shipped ones.
	cacheBudget, bodyBudget int64
	// keys are the certificate keys of the domains that carry a chain
	// (what the activation opens), by domain.
	keys map[string][]byte
}

// newHarness lays out slots, activates a release for every assigned slot
// (one domain in shared-default) and starts the supervisor. Everything is
// stopped and removed when the test ends.
func newHarness(t testing.TB, o harnessOpts) *harness {
	t.Helper()
	h := layoutHarness(t, o)
	h.start()
	return h
}

// prepareHarness lays out n slots, all assigned, without starting anything.
// Every crash counts as a healthy cell's first (HealthyAfter 1ms), which is
// what the crash-to-ready target is about. For analysis, benchmarks can run
// unenforced (CELLVISOR_BENCH_UNENFORCED=1) or with another per-cell CPU
// limit (CELLVISOR_BENCH_CPUS=2) to tell the supervisor's cost from the
// limits'.
func prepareHarness(t testing.TB, n int) *harness {
	o := harnessOpts{slots: n, assign: allAssigned(n),
		policy: supervisor.Policy{Initial: 10 * time.Millisecond, Max: time.Second, HealthyAfter: time.Millisecond}}
	if os.Getenv("CELLVISOR_BENCH_UNENFORCED") != "" {
		o.cg = unenforcedTB(t)
	}
	h := layoutHarness(t, o)
	if v := os.Getenv("CELLVISOR_BENCH_CPUS"); v != "" {
		cpus, _ := strconv.ParseFloat(v, 64)
		h.opts.Limits.CPUQuotaUS, h.opts.Limits.CPUPeriodUS = cgroup.CPULimits(cpus)
		sup, err := supervisor.New(h.opts)
		if err != nil {
			t.Fatal(err)
		}
		h.sup = sup
	}
	return h
}

func layoutHarness(t testing.TB, o harnessOpts) *harness {
	t.Helper()
	bin, mods := testutil.RequireOpenResty(t)
	if o.binary != "" {
		bin = o.binary
	}
	if o.modules != nil {
		mods = o.modules
	}
	if o.cg == nil {
		o.cg = testutil.RequireCgroups(t)
	}
	dir := t.TempDir()
	cfg := config.Default()
	cfg.StateDir, cfg.RunDir = filepath.Join(dir, "state"), filepath.Join(dir, "run")
	cfg.Slots = o.slots
	cfg.Ports.Address = "127.0.0.1"
	cfg.Ports.HTTPBase = testutil.PortBase(t, 2*o.slots)
	cfg.Ports.HTTPSBase = cfg.Ports.HTTPBase + o.slots
	cfg.OpenResty.Binary, cfg.OpenResty.Modules = bin, mods
	if o.workerConns != 0 {
		cfg.OpenResty.WorkerConnections = o.workerConns
	}
	cfg.OpenResty.Resolvers, cfg.OpenResty.ExposeCell = o.resolvers, o.exposeCell
	if o.caFile != "" {
		cfg.OpenResty.OriginCAFile = o.caFile
	}
	if o.cacheBudget != 0 {
		cfg.Limits.Cache = config.Bytes(o.cacheBudget)
	}
	if o.bodyBudget != 0 {
		cfg.Limits.RequestTmp = config.Bytes(o.bodyBudget)
	}
	topo, _, err := runtime.LoadOrCreate(runtime.Layout{Slots: o.slots, HTTPBase: cfg.Ports.HTTPBase, HTTPSBase: cfg.Ports.HTTPSBase,
		Address: "127.0.0.1", StateDir: cfg.StateDir, RunDir: cfg.RunDir})
	if err != nil {
		t.Fatal(err)
	}
	if o.assign == nil {
		o.assign = runtime.InitialAssignments(topo)
	}
	if o.domains == nil {
		o.domains = []domain.Domain{{
			Domain: testHost, Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{testHost},
			Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: "hello"}}},
		}}
	}
	pools, err := runtime.CompilePools(o.domains)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range topo.Slots {
		if pool := o.assign[s.Name]; pool != "" {
			seq := o.sequence
			if seq == 0 {
				seq = 1
			}
			p := agent.RenderParams(cfg, s, pool, seq)
			p.AuthWindow = o.authWindow
			p.Limits = o.limits
			if pools[pool] != nil {
				pools[pool].Keys = o.keys
			}
			r, err := runtime.BuildRelease(p, pools[pool])
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := runtime.Activate(s, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if o.users != nil {
		testutil.Traversable(t, dir)
		gids := map[string]int{}
		for name, u := range o.users {
			gids[name] = int(u.GID)
		}
		if err := topo.Own(cfg.StateDir, cfg.RunDir, gids); err != nil {
			t.Fatal(err)
		}
	}
	if o.policy == (supervisor.Policy{}) {
		o.policy = supervisor.Policy{Initial: 10 * time.Millisecond, Max: time.Second, HealthyAfter: time.Minute}
	}
	opts := supervisor.Options{
		Binary: bin, Topology: topo, Assignments: o.assign, Cgroups: o.cg,
		Limits: agent.CellLimits(cfg), Policy: o.policy, Refusal: o.refusal,
		ReadyTimeout: o.ready, StopTimeout: 5 * time.Second,
		DrainTimeout: o.drain, MonitorInterval: o.monitor, LogBudget: int64(cfg.Limits.Logs),
		CacheBudget: int64(cfg.Limits.Cache), RequestBudget: int64(cfg.Limits.RequestTmp),
		RestartLimit: o.limit, Liveness: o.liveness, Users: o.users, RuntimeUpgrade: o.upgrade,
		RuntimeUpgradePace: o.pace, Watch: o.modules,
	}
	sup, err := supervisor.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &harness{t: t, bin: bin, ctx: ctx, sup: sup, cg: o.cg, topo: topo, cancel: cancel, opts: opts, cfg: cfg, keys: o.keys}
}

// restart stops the supervisor and starts a new one on the same state, as
// an agent restart does.
func (h *harness) restart() {
	h.t.Helper()
	if err := h.stop(); err != nil {
		h.t.Fatal(err)
	}
	sup, err := supervisor.New(h.opts)
	if err != nil {
		h.t.Fatal(err)
	}
	h.sup = sup
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.start()
}

// slotSpec returns the topology's slot.
func (h *harness) slotSpec(name string) runtime.Slot {
	s, ok := h.topo.Slot(name)
	if !ok {
		h.t.Fatalf("no slot %s", name)
	}
	return s
}

// start runs the supervisor and waits for its first outcomes.
func (h *harness) start() {
	h.done = make(chan error, 1)
	go func() { h.done <- h.sup.Run(h.ctx) }()
	h.t.Cleanup(func() { h.stop() })
	select {
	case <-h.sup.Ready():
	case <-time.After(30 * time.Second):
		h.t.Fatal("supervisor not ready in 30s")
	}
}

// stop stops the supervisor and waits for it; it is safe to call twice.
func (h *harness) stop() error {
	h.cancel()
	if h.done == nil {
		return nil
	}
	select {
	case err := <-h.done:
		h.done <- err
		return err
	case <-time.After(60 * time.Second):
		h.t.Fatal("supervisor did not stop in 60s")
		return nil
	}
}

func (h *harness) slot(name string) supervisor.SlotStatus {
	for _, s := range h.sup.Status().Slots {
		if s.Name == name {
			return s
		}
	}
	h.t.Fatalf("no slot %s", name)
	return supervisor.SlotStatus{}
}

// get fetches path from a cell's HTTP port with the test domain's Host.
func get(port int, path string) (int, string, error) { return getWith(port, path, "") }

// getWith is get with the request tagged in X-Req (for an origin to see).
func getWith(port int, path, tag string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Host = testHost
	if tag != "" {
		req.Header.Set("X-Req", tag)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitReady waits until the slot is ready with a pid other than not.
func (h *harness) waitReady(name string, not int) supervisor.SlotStatus {
	var st supervisor.SlotStatus
	testutil.Eventually(h.t, 30*time.Second, func() error {
		st = h.slot(name)
		if st.State != supervisor.StateReady || st.PID == 0 || st.PID == not {
			return fmt.Errorf("%s is %s pid %d (%s)", name, st.State, st.PID, st.Reason)
		}
		return nil
	})
	return st
}
