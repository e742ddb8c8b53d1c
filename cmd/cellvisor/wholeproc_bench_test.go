package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/domain"
	"cellvisor/runtime"
	"cellvisor/testkit/testutil"
)

// The whole-process benchmarks measure what a host feels, from outside: the
// agent binary exec'd with its state on disk until every cell answers, and a
// cell killed until it answers again, against the same cells' own
// nginx.conf started by a minimal spawner and by the classic supervisors,
// all in one run so that the ratios compare like with like on a shared,
// noisy machine.

// wholeSlots is the number of cells of the whole-process benchmarks.
const wholeSlots = 8

// wholeEnv is an agent with wholeSlots cells, all assigned, whose state
// directory holds an active release for each (laid out by one untimed run).
type wholeEnv struct {
	bin     string // the cellvisor binary
	cfgPath string
	cfg     config.Agent
	slots   []runtime.Slot
	nginx   string
	mods    []string
	floor   cgroup.Group // every floor supervisor runs in it, and is killed with it
	// standby says the agent keeps a standby per slot (v1), which the
	// crash waits for: false with CELLVISOR_BENCH_NO_STANDBY=1, to measure
	// an earlier build named by CELLVISOR_BENCH_AGENT (a before/after in
	// one sitting).
	standby bool
	// spawn is floorspawn, and spawnSpecs its spec for each exec'd floor
	// this host runs (floorspawn_bench_test.go); cg is the benchmark's
	// cgroup subtree, where floor-cg makes its groups (nil without it).
	spawn      string
	spawnSpecs map[string]string
	cg         cgroup.Manager
}

func newWholeEnv(b *testing.B) *wholeEnv {
	b.Helper()
	testutil.RequireRoot(b)
	nginx, mods := testutil.RequireOpenResty(b)
	m := testutil.RequireCgroups(b)
	floor, err := m.Ensure("floor", cgroup.Limits{MemoryBytes: 8 << 30, CPUQuotaUS: -1, CPUPeriodUS: 100000})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { // before the subtree's removal, which lists cells only
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := floor.Delete(ctx); err != nil {
			b.Error(err)
		}
	})
	e := &wholeEnv{bin: os.Getenv("CELLVISOR_BENCH_AGENT"), nginx: nginx, mods: mods, floor: floor,
		standby: os.Getenv("CELLVISOR_BENCH_NO_STANDBY") == ""}
	if e.bin == "" {
		e.bin = buildAgent(b)
	}
	e.cfgPath, e.cfg = agentConfig(b, wholeSlots, "")
	e.cfg = asPackaged(b, e.cfgPath, e.cfg)
	all := runtime.Assignments{}
	for i := 1; i <= wholeSlots; i++ {
		all[runtime.SlotName(i)] = domain.PoolSharedDefault
	}
	if err := os.MkdirAll(e.cfg.StateDir, 0o750); err != nil {
		b.Fatal(err)
	}
	data, _ := json.Marshal(all)
	if err := os.WriteFile(filepath.Join(e.cfg.StateDir, "assignments.json"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	// One untimed run lays out the topology and the releases: every timed
	// start is an agent (re)started on a host that already has them.
	a, _ := startAgent(b, e.bin, e.cfgPath, e.cfg)
	if code := a.stop(b); code != 0 {
		b.Fatalf("agent exit %d", code)
	}
	topo, _, err := runtime.LoadOrCreate(runtime.Layout{
		Slots: e.cfg.Slots, HTTPBase: e.cfg.Ports.HTTPBase, HTTPSBase: e.cfg.Ports.HTTPSBase,
		Address: e.cfg.Ports.Address, StateDir: e.cfg.StateDir, RunDir: e.cfg.RunDir,
	})
	if err != nil {
		b.Fatal(err)
	}
	e.slots = topo.Slots
	e.floorSpawns(b, m)
	return e
}

// asPackaged rewrites the test agent's configuration cfg, at cfgPath, to run as
// the packaged unit runs it, and returns it loaded: its run directory on a
// tmpfs (the unit's RuntimeDirectory=, /run/cellvisor), where the masters'
// records, pid files and private sockets go, and logging at info, the
// default (debug with CELLVISOR_BENCH_AGENT_LOG, whose timelines need the
// start's debug lines). The floors run the same cells' configuration, so
// their pid files and sockets move to the tmpfs too. Where /dev/shm is no
// tmpfs the run directory stays, and the benchmark says so.
func asPackaged(b *testing.B, cfgPath string, cfg config.Agent) config.Agent {
	b.Helper()
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	y := string(data)
	if os.Getenv("CELLVISOR_BENCH_AGENT_LOG") == "" {
		y = strings.Replace(y, "level: debug\n", "level: info\n", 1)
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		run, err := os.MkdirTemp("/dev/shm", "cellvisor-bench-run-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(run) })
		y = strings.Replace(y, "run_dir: "+cfg.RunDir+"\n", "run_dir: "+run+"\n", 1)
	} else {
		b.Logf("run directory on disk: /dev/shm is no tmpfs here (%v)", err)
	}
	if err := os.WriteFile(cfgPath, []byte(y), 0o644); err != nil {
		b.Fatal(err)
	}
	cfg, err = config.Load(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	return cfg
}

// nginxArgs are the arguments the supervisor starts a cell's master with.
func nginxArgs(s runtime.Slot) []string {
	return []string{"-p", s.Dir + "/", "-c", s.ConfPath(), "-e", filepath.Join(s.LogsDir(), "error.log")}
}

// await polls until ok holds, every 500µs, for at most 20s.
func await(ctx context.Context, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	t := time.NewTicker(500 * time.Microsecond)
	defer t.Stop()
	for !ok() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// accepts reports whether 127.0.0.1:port accepts a TCP connection.
func accepts(port int) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// answers200 reports whether GET path on port answers 200 (one HTTP/1.0
// exchange on a fresh connection: the cheapest client, the same for every
// contender).
func answers200(port int, path string) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: bench\r\n\r\n", path); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "HTTP/1.1 200 ")
}

// awaitAll waits, one poller per cell, until every cell answers 200 on its
// readiness path, and returns how long that took from t0.
func (e *wholeEnv) awaitAll(b *testing.B, t0 time.Time) time.Duration {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(e.slots))
	for _, s := range e.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := await(context.Background(), func() bool { return answers200(s.HTTPPort, "/.cellvisor/ready") }); err != nil {
				errs <- fmt.Errorf("%s: %w", s.Name, err)
			}
		}()
	}
	wg.Wait()
	took := time.Since(t0)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return took
}

// bareSpawn execs the 8 masters at once, as a minimal spawner would, and
// returns a stop function that kills and reaps them.
func (e *wholeEnv) bareSpawn(b *testing.B, slots []runtime.Slot) func() {
	b.Helper()
	var cmds []*exec.Cmd
	stop := func() {
		for _, c := range cmds {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		}
		cmds = nil
	}
	b.Cleanup(stop)
	for _, s := range slots {
		os.Remove(s.PrivateSocket()) // what the supervisor does too
		cmd := exec.Command(e.nginx, nginxArgs(s)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	return stop
}

// classic is a classic supervisor: its binary and how it is told to scan a
// directory of services.
type classic struct {
	name string
	bin  string
}

var classics = []classic{
	{"daemontools", "svscan"},
	{"s6", "s6-svscan"},
	{"runit", "runsvdir"},
}

// serviceDir lays out one service per cell, each a run script that execs
// the cell's master in the foreground (its config says daemon off).
func (e *wholeEnv) serviceDir(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	for _, s := range e.slots {
		sd := filepath.Join(dir, s.Name)
		if err := os.MkdirAll(sd, 0o755); err != nil {
			b.Fatal(err)
		}
		script := "#!/bin/sh\nexec " + e.nginx + " " + strings.Join(nginxArgs(s), " ") + " 2>&1\n"
		if err := os.WriteFile(filepath.Join(sd, "run"), []byte(script), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// runClassic starts sup on a fresh service directory inside the floor
// cgroup, and returns its stop function, which kills everything it started.
func (e *wholeEnv) runClassic(b *testing.B, sup string) (time.Time, func()) {
	b.Helper()
	dir := e.serviceDir(b)
	for _, s := range e.slots {
		os.Remove(s.PrivateSocket())
	}
	cmd := exec.Command(sup, dir)
	cmd.Stdout, cmd.Stderr = nil, nil
	t0 := time.Now()
	if err := cgroup.Start(e.floor, cmd); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := e.floor.Kill(ctx); err != nil {
			b.Error(err)
		}
		<-done
	}
	b.Cleanup(stop)
	return t0, stop
}

// minimalConf writes a minimal nginx + Lua configuration serving "ok" on
// port, and returns its nginx arguments.
func (e *wholeEnv) minimalConf(b *testing.B, port int) []string {
	b.Helper()
	dir := b.TempDir()
	var mb strings.Builder
	for _, m := range e.mods {
		fmt.Fprintf(&mb, "load_module %s;\n", m)
	}
	conf := mb.String() + fmt.Sprintf(`daemon off;
master_process on;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    server {
        listen 127.0.0.1:%[2]d;
        location / { content_by_lua_block { ngx.say("ok") } }
    }
}
`, dir, port)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	return []string{"-p", dir + "/", "-c", path, "-e", filepath.Join(dir, "error.log")}
}

// execOne execs one nginx with args and returns how long until port
// accepts and until path answers 200; it stops the nginx after.
func execOne(b *testing.B, bin string, args []string, port int, path string) (accept, answer time.Duration) {
	b.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	if err := await(context.Background(), func() bool { return accepts(port) }); err != nil {
		b.Fatalf("port %d never accepted: %v", port, err)
	}
	accept = time.Since(t0)
	if err := await(context.Background(), func() bool { return answers200(port, path) }); err != nil {
		b.Fatalf("port %d never answered: %v", port, err)
	}
	return accept, time.Since(t0)
}

// samples collects one duration per iteration for each measure.
type samples map[string][]time.Duration

func (s samples) median(k string) float64 {
	v := slices.Clone(s[k])
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return float64(v[len(v)/2]) / float64(time.Millisecond)
}

// BenchmarkWholeProcess8: each iteration, in turn, on the same 8 cells and
// their same rendered nginx.conf files:
//
//   - agent: exec of `cellvisor run` (state with an active release for every
//     cell, cgroups created by the run) until every cell answers 200;
//   - floor: the 8 masters exec'd at once by a minimal spawner, until every
//     one answers 200 (before the agent every other iteration, after it
//     otherwise); then daemontools (svscan), s6 (s6-svscan) and runit
//     (runsvdir) on a service directory of the same 8, each skipped with the
//     reason when its binary is missing;
//   - crash: with the agent running, kill -9 of every process of cell-03's
//     cgroup until its port accepts again and until it answers 200;
//   - exec: cell-03's master exec'd bare until it accepts and answers, and a
//     minimal nginx + Lua configuration on the same port until it answers.
//
// Each measure is reported as its median over the iterations (ms-…), with
// the ratios the targets are stated in (ratio-…), each the median of the
// iterations' own ratios: the two sides of a ratio ran seconds apart, so
// the host's drift over a sitting cancels out. CELLVISOR_BENCH_NO_CLASSICS=1
// leaves the classic supervisors out, for a quicker before/after sitting.
func BenchmarkWholeProcess8(b *testing.B) {
	e := newWholeEnv(b)
	var have []classic
	for _, c := range classics {
		if os.Getenv("CELLVISOR_BENCH_NO_CLASSICS") != "" {
			break
		}
		if p, err := exec.LookPath(c.bin); err != nil {
			b.Logf("%s floor skipped: %s not found (make deps installs it)", c.name, c.bin)
		} else {
			have = append(have, classic{c.name, p})
		}
	}
	victim := e.slots[2]
	g, err := cgroup.New(cgroup.Options{Subtree: e.cfg.Cgroup.Subtree})
	if err != nil {
		b.Fatal(err)
	}
	minimal := e.minimalConf(b, victim.HTTPPort)
	s := samples{}
	n := counts{}
	// The minimal spawner.
	bareFloor := func() {
		settle()
		h0 := hostCPU()
		t0 := time.Now()
		stop := e.bareSpawn(b, e.slots)
		s["floor"] = append(s["floor"], e.awaitAll(b, t0))
		n["host-cpu-ms-floor"] = append(n["host-cpu-ms-floor"], (hostCPU()-h0).Seconds()*1e3)
		stop()
	}
	for i := 0; b.Loop(); i++ {
		// The floor runs before the agent every other iteration, after it
		// otherwise: what either leaves the kernel to finish (the agent's
		// cells' groups removed at its stop, sixteen processes torn down)
		// falls on each side's start as often.
		floorFirst := i%2 == 1
		if floorFirst {
			bareFloor()
		}
		// The agent, from exec to every cell answering.
		// From just before the exec, as for the other contenders (not
		// counting the log file the test harness makes first).
		settle()
		h0 := hostCPU()
		a := launchAgent(b, e.bin, e.cfgPath)
		s["agent"] = append(s["agent"], e.awaitAll(b, a.started))
		n["host-cpu-ms-agent"] = append(n["host-cpu-ms-agent"], (hostCPU()-h0).Seconds()*1e3)
		n["agent-self-cpu-ms-start"] = append(n["agent-self-cpu-ms-start"], threadsCPU(b, a.cmd.Process.Pid).Seconds()*1e3)

		// Crash of cell-03, master and worker, with the agent running.
		cg, err := g.Open(victim.Name)
		if err != nil {
			b.Fatal(err)
		}
		// A crash comes long after the cell was ready: by then its slot
		// has its standby (v1), which the kill spares (it is no nginx).
		if g.Mode() == cgroup.ModeV1Hybrid && e.standby {
			if err := await(context.Background(), func() bool { return standbyJoined(cg) }); err != nil {
				b.Fatalf("cell-03 standby never joined: %v", err)
			}
		}
		settle()
		victims := nginxProcs(b, cg, e.nginx)
		if len(victims) < 2 {
			b.Fatalf("cell-03 nginx processes %v: want master and worker", victims)
		}
		t0 := time.Now()
		for _, pid := range victims {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		// The port closes with the last of its holders: once none is alive,
		// a dial accepted is the new master's. How long the kernel takes to
		// tear the killed processes down is measured on the way.
		if err := await(context.Background(), func() bool { return !anyAlive(victims) }); err != nil {
			b.Fatalf("killed cell never died: %v", err)
		}
		s["crash-dead"] = append(s["crash-dead"], time.Since(t0))
		if err := await(context.Background(), func() bool { return accepts(victim.HTTPPort) }); err != nil {
			b.Fatalf("crashed cell never accepted again: %v", err)
		}
		s["crash-accept"] = append(s["crash-accept"], time.Since(t0))
		if err := await(context.Background(), func() bool { return answers200(victim.HTTPPort, "/.cellvisor/ready") }); err != nil {
			b.Fatalf("crashed cell never answered again: %v", err)
		}
		s["crash-answer"] = append(s["crash-answer"], time.Since(t0))
		crashUse := leafUsage(b, g)
		n["agent-throttled-crash"] = append(n["agent-throttled-crash"], float64(crashUse.CPUThrottled))
		if code := a.stop(b); code != 0 {
			b.Fatalf("agent exit %d", code)
		}

		if !floorFirst {
			bareFloor()
		}
		n["ratio-start-vs-floor"] = append(n["ratio-start-vs-floor"], ratio(s, "agent", "floor"))

		// The same masters from floorspawn, exec'd from cold.
		for _, f := range floorSpawnNames {
			if e.spawnSpecs[f] == "" {
				continue
			}
			settle()
			h0 := hostCPU()
			t0, stop := e.spawnFloor(b, f)
			s[f] = append(s[f], e.awaitAll(b, t0))
			n["host-cpu-ms-"+f] = append(n["host-cpu-ms-"+f], (hostCPU()-h0).Seconds()*1e3)
			if f == "floor-cg" {
				e.checkFloorCg(b)
			}
			stop()
			n["ratio-"+f+"-vs-floor"] = append(n["ratio-"+f+"-vs-floor"], ratio(s, f, "floor"))
		}
		if e.spawnSpecs["floor-cg"] != "" {
			n["ratio-start-vs-floor-cg"] = append(n["ratio-start-vs-floor-cg"], ratio(s, "agent", "floor-cg"))
		}

		// The classic supervisors.
		for _, c := range have {
			settle()
			t0, stop := e.runClassic(b, c.bin)
			s[c.name] = append(s[c.name], e.awaitAll(b, t0))
			stop()
		}

		// One cell's configuration exec'd bare, and a minimal one.
		os.Remove(victim.PrivateSocket())
		settle()
		acc, ans := execOne(b, e.nginx, nginxArgs(victim), victim.HTTPPort, "/.cellvisor/ready")
		s["exec-accept"] = append(s["exec-accept"], acc)
		s["exec-answer"] = append(s["exec-answer"], ans)
		settle()
		_, ans = execOne(b, e.nginx, minimal, victim.HTTPPort, "/")
		s["minimal-answer"] = append(s["minimal-answer"], ans)
		n["ratio-crash-accept-vs-exec"] = append(n["ratio-crash-accept-vs-exec"], ratio(s, "crash-accept", "exec-accept"))
		n["ratio-crash-answer-vs-exec"] = append(n["ratio-crash-answer-vs-exec"], ratio(s, "crash-answer", "exec-answer"))
		n["ratio-cellconf-vs-minimal"] = append(n["ratio-cellconf-vs-minimal"], ratio(s, "exec-answer", "minimal-answer"))
	}
	for _, k := range slices.Concat([]string{"agent", "floor"}, floorSpawnNames, []string{"crash-dead", "crash-accept", "crash-answer", "exec-accept", "exec-answer", "minimal-answer"}) {
		if len(s[k]) > 0 {
			b.ReportMetric(s.median(k), "ms-"+k)
		}
	}
	for _, c := range have {
		b.ReportMetric(s.median(c.name), "ms-"+c.name)
	}
	// Throttling is reported as its worst iteration: one throttled crash
	// recovery is one too many. (The agent's quota, and on v1 its leaf,
	// apply once every cell has started: its CPU until then is its
	// threads' own, agent-self-cpu-ms-start.)
	b.ReportMetric(n.max("agent-throttled-crash"), "agent-throttled-crash-max")
	b.ReportMetric(n.median("agent-self-cpu-ms-start"), "agent-self-cpu-ms-start")
	if hostCPU() > 0 {
		b.ReportMetric(n.median("host-cpu-ms-agent"), "host-cpu-ms-agent")
		b.ReportMetric(n.median("host-cpu-ms-floor"), "host-cpu-ms-floor")
		for _, f := range floorSpawnNames {
			if len(n["host-cpu-ms-"+f]) > 0 {
				b.ReportMetric(n.median("host-cpu-ms-"+f), "host-cpu-ms-"+f)
			}
		}
	}
	for _, k := range []string{"ratio-start-vs-floor", "ratio-floor-exec-vs-floor", "ratio-floor-held-vs-floor", "ratio-floor-cg-vs-floor", "ratio-start-vs-floor-cg", "ratio-crash-accept-vs-exec", "ratio-crash-answer-vs-exec", "ratio-cellconf-vs-minimal"} {
		if len(n[k]) > 0 {
			b.ReportMetric(n.median(k), k)
		}
	}
}

// ratio is this iteration's (the last) sample of num over that of den.
func ratio(s samples, num, den string) float64 {
	return float64(s[num][len(s[num])-1]) / float64(s[den][len(s[den])-1])
}

// counts collects one counter reading per iteration for each measure.
type counts map[string][]float64

func (c counts) median(k string) float64 {
	v := slices.Clone(c[k])
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func (c counts) max(k string) float64 {
	if len(c[k]) == 0 {
		return 0
	}
	return slices.Max(c[k])
}

// leafUsage reads the agent leaf's counters (cpu.stat's nr_throttled and
// throttled_time, cpuacct.usage): deterministic where times are not. On
// v1 the leaf is made when the agent moves in, once its cells are ready.
func leafUsage(b *testing.B, m cgroup.Manager) cgroup.Usage {
	b.Helper()
	var leaf cgroup.Group
	if err := await(context.Background(), func() bool {
		var err error
		leaf, err = m.Open(cgroup.AgentLeaf)
		return err == nil
	}); err != nil {
		b.Fatalf("no agent leaf: %v", err)
	}
	u, err := leaf.Usage()
	if err != nil {
		b.Fatal(err)
	}
	return u
}

// threadsCPU is the CPU time pid's threads have run, from their
// schedstat (nanoseconds, unlike the 10ms ticks of /proc/PID/stat): the
// agent's own, without the helpers it forks.
func threadsCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(stats) == 0 {
		b.Fatalf("threads of %d: %v", pid, err)
	}
	var sum time.Duration
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that ended
		}
		fields := strings.Fields(string(data))
		if len(fields) > 0 {
			ns, _ := strconv.ParseInt(fields[0], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}

// nginxProcs are the group's processes running bin: the cell's master and
// workers, not its standby.
func nginxProcs(b *testing.B, g cgroup.Group, bin string) []int {
	b.Helper()
	pids, err := g.Procs()
	if err != nil {
		b.Fatal(err)
	}
	want, err := filepath.EvalSymlinks(bin)
	if err != nil {
		b.Fatal(err)
	}
	return slices.DeleteFunc(pids, func(pid int) bool {
		exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
		return err != nil || exe != want
	})
}

// standbyJoined reports whether a standby (a process that is not nginx,
// named cellvisor-standby) sits in every hierarchy of g.
func standbyJoined(g cgroup.Group) bool {
	pids, err := g.Procs()
	if err != nil {
		return false
	}
	for _, pid := range pids {
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil || !strings.Contains(string(cmdline), "cellvisor-standby") {
			continue
		}
		if inAll(g, pid) {
			return true
		}
	}
	return false
}

// inAll reports whether pid is in g's cgroup.procs in every hierarchy.
func inAll(g cgroup.Group, pid int) bool {
	for c, p := range g.Paths() {
		data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", c, p, "cgroup.procs"))
		if err != nil || !slices.Contains(strings.Fields(string(data)), strconv.Itoa(pid)) {
			return false
		}
	}
	return true
}

// settle waits, at most a second, until the host has been all but idle
// (under half a millisecond of CPU on all its CPUs) for 5 ms: what a
// contender left the kernel to finish once stopped (its processes torn
// down, its cgroups freed, which the kernel does after rmdir returns) must
// not fall on the next one's start. Without it, the floor measured right
// after the agent's stop started 8 % slower than the floor measured before
// the agent's start (83.8 against 77.5 ms, 10 runs each).
func settle() {
	deadline := time.Now().Add(time.Second)
	prev := hostCPU()
	for time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		cur := hostCPU()
		if cur-prev < 500*time.Microsecond {
			return
		}
		prev = cur
	}
}

// hostCPU is the CPU time every process of the host has run, from the
// root cgroup's accounting (v1 cpuacct.usage, v2 cpu.stat usage_usec), or
// 0 where neither can be read.
func hostCPU() time.Duration {
	if data, err := os.ReadFile("/sys/fs/cgroup/cpuacct/cpuacct.usage"); err == nil {
		ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		if err == nil {
			return time.Duration(ns)
		}
	}
	data, err := os.ReadFile("/sys/fs/cgroup/cpu.stat")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return time.Duration(us) * time.Microsecond
			}
		}
	}
	return 0
}

func anyAlive(pids []int) bool {
	return slices.ContainsFunc(pids, testutil.Alive)
}
