package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/cgexec"
	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/domain"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// buildAgent builds the cellvisor binary once per test run.
func buildAgent(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cellvisor")
	if err := testutil.GoBuild(".", bin, cgexec.LDFlags()); err != nil {
		t.Fatal(err)
	}
	return bin
}

// agentConfig writes a config for slots on free loopback ports in a fresh
// cgroup subtree, and returns its path.
func agentConfig(t testing.TB, slots int, extra string) (string, config.Agent) {
	t.Helper()
	bin, mods := testutil.RequireOpenResty(t)
	dir := t.TempDir()
	domains := filepath.Join(dir, "domains")
	if err := os.MkdirAll(domains, 0o755); err != nil {
		t.Fatal(err)
	}
	doc := `{"domain":"app.test","pool":"shared-default","revision":1,"hostnames":["app.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"hi"}}]}`
	if err := os.WriteFile(filepath.Join(domains, "app.json"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	base := testutil.PortBase(t, 2*slots)
	var mb strings.Builder
	for _, m := range mods {
		fmt.Fprintf(&mb, "\n    - %s", m)
	}
	domainsDir := "domains_dir: " + dir + "/domains"
	if strings.Contains(extra, "source:") {
		domainsDir = "" // one source of configuration
	}
	if !strings.Contains(extra, "metrics:") {
		// Off unless a test asks: agents of parallel tests would all ask
		// for the default port.
		extra = "metrics:\n  listen: \"\"\n" + extra
	}
	yaml := fmt.Sprintf(`state_dir: %[1]s/state
run_dir: %[1]s/run
%[9]s
slots: %[2]d
openresty:
  binary: %[3]s
  modules:%[4]s
ports:
  address: 127.0.0.1
  http_base: %[5]d
  https_base: %[6]d
cgroup:
  subtree: cvtest-%[7]d-%[5]d
  scope: off
log:
  level: debug
%[8]s`, dir, slots, bin, mb.String(), base, base+slots, os.Getpid(), extra, domainsDir)
	path := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		t.Cleanup(func() { // runs after the agent is stopped (cleanups run last-in first-out)
			if m, err := cgroup.New(cgroup.Options{Subtree: cfg.Cgroup.Subtree}); err == nil && m.Mode() != cgroup.ModeUnenforced {
				testutil.RemoveSubtree(t, m)
			}
		})
	}
	return path, cfg
}

// runningAgent is a cellvisor run process started by a test.
type runningAgent struct {
	cmd     *exec.Cmd
	log     string        // the file its output goes to
	exited  chan struct{} // closed once reaped; cmd.ProcessState is valid then
	started time.Time     // just before its exec
}

// stop sends SIGTERM and waits, bounded, for the agent to exit.
func (a *runningAgent) stop(t testing.TB) int {
	t.Helper()
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
		return a.cmd.ProcessState.ExitCode()
	case <-time.After(60 * time.Second):
		t.Fatal("agent did not exit within 60s of SIGTERM")
		return -1
	}
}

// launchAgent execs the binary's `run` with cfgPath (and env) without
// waiting for anything. When the test ends it is stopped by its pid if it
// still runs; its log is printed if the test failed, and appended to
// $CELLVISOR_BENCH_AGENT_LOG when that is set.
func launchAgent(t testing.TB, bin, cfgPath string, env ...string) *runningAgent {
	t.Helper()
	cmd := exec.Command(bin, "--config", cfgPath, "run")
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &runningAgent{cmd: cmd, log: logf.Name(), exited: make(chan struct{}), started: started}
	go func() { _ = cmd.Wait(); close(a.exited) }()
	t.Cleanup(func() {
		select {
		case <-a.exited:
		default:
			a.stop(t)
		}
		logf.Close()
		data, _ := os.ReadFile(logf.Name())
		if dst := os.Getenv("CELLVISOR_BENCH_AGENT_LOG"); dst != "" {
			appendLog(dst, data)
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", data)
		}
	})
	return a
}

// appendLog appends one agent's log to the file at path, best effort: it
// is for reading a benchmark's timeline afterwards.
func appendLog(path string, data []byte) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.Write(data)
}

// startAgent runs the binary with cfgPath and waits until its admin socket
// reports every assigned cell ready (or a refusal). It is stopped by its pid
// if still running when the test ends.
func startAgent(t testing.TB, bin, cfgPath string, cfg config.Agent, env ...string) (*runningAgent, supervisor.Status) {
	t.Helper()
	a := launchAgent(t, bin, cfgPath, env...)
	var st supervisor.Status
	var err error
	testutil.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err = adminsock.FetchStatus(ctx, agent.AdminSocket(cfg))
		if err != nil {
			return err
		}
		for _, s := range st.Slots {
			if s.Assignment == supervisor.Assigned && s.State != supervisor.StateReady && st.Refusal == "" {
				return fmt.Errorf("%s is %s", s.Name, s.State)
			}
		}
		return nil
	})
	return a, st
}

// SIGTERM stops every cell gracefully, exits 0 and leaves no cell process
// and no cell cgroup behind.
func TestAgentSIGTERMLeavesNothingBehind(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	cfgPath, cfg := agentConfig(t, 4, "")
	notify := listenNotify(t)
	a, st := startAgent(t, bin, cfgPath, cfg, "NOTIFY_SOCKET="+notify.path, "WATCHDOG_USEC=100000")
	if st.CgroupMode == cgroup.ModeUnenforced {
		t.Skipf("cell limits cannot be enforced here: %s", st.Refusal)
	}
	var pids []int
	for _, s := range st.Slots {
		if s.PID != 0 {
			pids = append(pids, s.PID)
		}
	}
	if len(pids) != 2 {
		t.Fatalf("running masters %v, want cell-01 and cell-02", pids)
	}
	m, err := cgroup.New(cgroup.Options{Subtree: cfg.Cgroup.Subtree})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cell-01", "cell-02"} {
		g, err := m.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		procs, _ := g.Procs()
		pids = append(pids, procs...)
	}
	notify.await(t, "READY=1", "STATUS=4 slots: 2 ready, 0 drained, 0 degraded, 2 stopped", "WATCHDOG=1")
	if st.CgroupMode == cgroup.ModeV1Hybrid && cgexec.LDFlags() != "" {
		// Built as make build builds it, the agent joins through the
		// helper in its own binary, not the shell.
		if log, _ := os.ReadFile(a.log); !bytes.Contains(log, []byte(`"join_helper":"built-in"`)) {
			t.Errorf("the agent's log does not say its join helper is built in:\n%s", log)
		}
	}
	if fi, err := os.Stat(agent.AdminSocket(cfg)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("admin socket: %v mode %v, want 0600", err, fi.Mode().Perm())
	}
	table, err := exec.Command(bin, "--config", cfgPath, "status").CombinedOutput()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, table)
	}
	for _, want := range []string{"cgroups v1-hybrid", "cell-01  shared-default      ready", "cell-03  -                   stopped", "unassigned"} {
		if st.CgroupMode == cgroup.ModeV2 {
			want = strings.Replace(want, "v1-hybrid", "v2", 1)
		}
		if !strings.Contains(string(table), want) {
			t.Errorf("status table lacks %q:\n%s", want, table)
		}
	}
	if out, err := exec.Command(bin, "--config", cfgPath, "status", "-o", "yaml").CombinedOutput(); err == nil {
		t.Errorf("status -o yaml: want a refusal, got:\n%s", out)
	}
	if code := a.stop(t); code != 0 {
		t.Errorf("agent exit code %d after SIGTERM, want 0", code)
	}
	notify.await(t, "STOPPING=1")
	for _, pid := range pids {
		if testutil.Alive(pid) {
			t.Errorf("cell process %d survived the agent", pid)
		}
	}
	if names, _ := m.List(); len(names) != 0 {
		t.Errorf("cell cgroups left: %v", names)
	}
}

// An agent none of whose assigned cells can start says so where systemd and
// its log show it first: the unit is ready (the agent runs, retries and
// answers status), its STATUS= starts with NOT SERVING and names a cell and
// its reason, and the log has an error.
func TestNoCellServingIsLoud(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	cfgPath, _ := agentConfig(t, 3, "")
	broken := filepath.Join(t.TempDir(), "openresty")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'broken runtime' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	yaml := regexp.MustCompile(`(?m)^  binary: .*$`).ReplaceAllString(string(data), "  binary: "+broken)
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	notify := listenNotify(t)
	a := launchAgent(t, bin, cfgPath, "NOTIFY_SOCKET="+notify.path)
	notify.await(t, "READY=1", "STATUS=NOT SERVING: 0 of 2 assigned cells ready (cell-01: ")
	testutil.Eventually(t, 10*time.Second, func() error {
		log, _ := os.ReadFile(a.log)
		if !bytes.Contains(log, []byte(`"no assigned cell is serving"`)) {
			return fmt.Errorf("no error logged yet")
		}
		return nil
	})
}

// A changed slot count is refused before anything starts, and the persisted
// topology is untouched.
func TestChangedSlotCountRefused(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	cfgPath, cfg := agentConfig(t, 2, "")
	a, _ := startAgent(t, bin, cfgPath, cfg)
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit code %d", code)
	}
	data, _ := os.ReadFile(cfgPath)
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(string(data), "slots: 2", "slots: 1", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--config", cfgPath, "run").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "slot count cannot change") {
		t.Fatalf("agent with another slot count: %v\n%s", err, out[max(0, len(out)-600):])
	}
	if _, err := os.Stat(agent.AdminSocket(cfg)); err == nil {
		t.Error("a refused agent bound its admin socket")
	}
}

// A start refused after the cells' groups were prepared (a bad domains
// directory is found while they are made) leaves no cell group behind,
// and started nothing.
func TestRefusedStartLeavesNoCellGroups(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	cfgPath, cfg := agentConfig(t, 2, "")
	cells, err := cgroup.New(cgroup.Options{Subtree: cfg.Cgroup.Subtree})
	if err != nil {
		t.Fatal(err)
	}
	if cells.Mode() == cgroup.ModeUnenforced {
		t.Skipf("cell limits cannot be enforced on this host: %v", cells.Reason())
	}
	if err := os.WriteFile(filepath.Join(cfg.DomainsDir, "bad.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		t.Fatal(err)
	}
	assign := `{"cell-01":"` + domain.PoolSharedDefault + `","cell-02":"` + domain.PoolSharedDefault + `"}`
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "assignments.json"), []byte(assign), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--config", cfgPath, "run").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bad.json") {
		t.Fatalf("agent with a bad domains file: %v\n%s", err, out[max(0, len(out)-600):])
	}
	if names, err := cells.List(); err != nil || len(names) != 0 {
		t.Errorf("cell cgroups left by the refused start: %v (%v)", names, err)
	}
}

// notifySocket is a fake systemd notification socket.
type notifySocket struct {
	path string
	mu   sync.Mutex // guards got
	got  []string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	n := &notifySocket{path: filepath.Join(t.TempDir(), "notify.sock")}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.got = append(n.got, string(buf[:k]))
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return n
}

// await waits until, for every prefix, a message starting with it arrived.
func (n *notifySocket) await(t *testing.T, msgs ...string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, m := range msgs {
			if !slices.ContainsFunc(n.got, func(g string) bool { return strings.HasPrefix(g, m) }) {
				return fmt.Errorf("no %q in %d messages, last %q", m, len(n.got), n.got[max(0, len(n.got)-3):])
			}
		}
		return nil
	})
}

// The CLI drains, undrains and restarts a cell through the agent, and says
// why when it cannot.
func TestCLIControls(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	cfgPath, cfg := agentConfig(t, 3, "")
	startAgent(t, bin, cfgPath, cfg)
	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append([]string{"--config", cfgPath}, args...)...).CombinedOutput()
		return string(out), err
	}
	for _, tc := range []struct {
		args    []string
		ok      bool
		message string
	}{
		{[]string{"drain", "cell-01"}, true, "cell-01: drained"},
		{[]string{"undrain", "cell-01"}, true, "cell-01: ready"},
		{[]string{"restart", "cell-02"}, true, "cell-02: ready"},
		{[]string{"restart", "cell-03"}, false, "not running"},
		{[]string{"drain", "cell-09"}, false, "no such cell"},
		{[]string{"drain"}, false, "usage: cellvisor drain CELL"},
	} {
		out, err := run(tc.args...)
		if (err == nil) != tc.ok || !strings.Contains(out, tc.message) {
			t.Errorf("cellvisor %v: %v\n%s\nwant ok=%v and %q", tc.args, err, out, tc.ok, tc.message)
		}
		if op := strings.Join(tc.args, " ") + ":"; len(tc.args) == 2 && strings.Count(out, op) > 1 {
			t.Errorf("cellvisor %v names the operation more than once: %s", tc.args, out)
		}
	}
	// -o json prints the cell's status, the admin socket's shape.
	for _, tc := range []struct {
		verb  string
		state supervisor.State
	}{{"drain", supervisor.StateDrained}, {"undrain", supervisor.StateReady}, {"restart", supervisor.StateReady}} {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, tc.verb, "cell-01", "-o", "json", "--config", cfgPath)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var st supervisor.SlotStatus
		dec := json.NewDecoder(&stdout)
		dec.DisallowUnknownFields()
		if err != nil || dec.Decode(&st) != nil || st.Name != "cell-01" || st.State != tc.state || st.Drained != (tc.state == supervisor.StateDrained) ||
			st.PID == 0 || st.HTTPPort != cfg.Ports.HTTPBase || st.Pool != "shared-default" {
			t.Errorf("cellvisor %s cell-01 -o json: %v %s\n%+v\nwant cell-01 %s in shared-default", tc.verb, err, stderr.String(), st, tc.state)
		}
	}
}

// The agent's own leaf gets its memory limit at once on v2 (on v1 the leaf
// is made when the agent moves in) and its CPU quota once every cell has
// had its first outcome (a throttled agent held back the cells' start):
// both are set on a running agent. Its CPU weight goes
// ahead of the cells' until it has exec'd them, behind until they are up,
// then level with theirs.
func TestAgentOwnLimitsOnceCellsStarted(t *testing.T) {
	bin := buildAgent(t)
	cfgPath, cfg := agentConfig(t, 2, "")
	a, st := startAgent(t, bin, cfgPath, cfg)
	if st.Refusal != "" || st.CgroupMode == cgroup.ModeUnenforced {
		t.Skipf("no enforced cgroups here (%s %s)", st.CgroupMode, st.Refusal)
	}
	m, err := cgroup.New(cgroup.Options{Subtree: cfg.Cgroup.Subtree})
	if err != nil {
		t.Fatal(err)
	}
	var leaf cgroup.Group
	q, p := cgroup.CPULimits(cfg.AgentLimits.CPU)
	testutil.Eventually(t, 10*time.Second, func() error {
		if leaf == nil {
			if leaf, err = m.Open(cgroup.AgentLeaf); err != nil {
				return err
			}
		}
		l, err := leaf.Limits()
		if err != nil {
			return err
		}
		if l.CPUQuotaUS != q || l.CPUPeriodUS != p || l.MemoryBytes != int64(cfg.AgentLimits.Memory) {
			return fmt.Errorf("agent leaf limits %+v: want quota %d/%d µs, memory %d", l, q, p, int64(cfg.AgentLimits.Memory))
		}
		return nil
	})
	if st.CgroupMode == cgroup.ModeV1Hybrid {
		shares, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", leaf.Paths()["cpu"], "cpu.shares"))
		if err != nil || strings.TrimSpace(string(shares)) != "1024" {
			t.Errorf("agent leaf cpu.shares %q (%v) once the cells are up: want the default 1024", shares, err)
		}
	}
	var weights []string
	data, err := os.ReadFile(a.log)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		var e struct {
			Msg    string `json:"msg"`
			Weight int    `json:"weight"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "agent CPU weight" {
			weights = append(weights, strconv.Itoa(e.Weight))
		}
	}
	// The start's weights apply where the agent is in its leaf from the
	// start (v2); on v1 it moves in once its cells have started.
	want := map[cgroup.Mode]string{cgroup.ModeV2: "1000 10 100", cgroup.ModeV1Hybrid: "100"}[st.CgroupMode]
	if got := strings.Join(weights, " "); got != want {
		t.Errorf("the agent's CPU weights in turn: %q, want %q", got, want)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if !inAll(leaf, a.cmd.Process.Pid) {
			return fmt.Errorf("agent %d is not in its leaf %v once its cells are up", a.cmd.Process.Pid, leaf.Paths())
		}
		return nil
	})
}
