package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cellvisor/cgexec"
	"cellvisor/testkit/testutil"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildDemo builds cellvisor-demo and, beside it, the agent it runs, once
// per test binary, and returns the demo's path.
func buildDemo(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "cellvisor-demo-test-"); buildErr != nil {
			return
		}
		for _, b := range []struct{ out, pkg, ldflags string }{{"cellvisor", "../cellvisor", cgexec.LDFlags()}, {"cellvisor-demo", ".", ""}} {
			if buildErr = testutil.GoBuild(b.pkg, filepath.Join(binDir, b.out), b.ldflags); buildErr != nil {
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "cellvisor-demo")
}

// demoArgs are the flags of a demo in dir on free loopback ports (both the
// HTTP and the HTTPS range, 363 above).
func demoArgs(t *testing.T, dir string) []string {
	return []string{"--dir", dir, "--http-base", strconv.Itoa(testutil.PortBase(t, 371))}
}

// TestDemoCheck runs the scenario of docs/demo.md: start, drain, undrain, publish,
// restart and the rate limit, then placement: a reserved pool on cell-03
// and cell-04 serving its own domain, and the sample domain moved into it
// with no failed request; then nothing of the demo is left running.
func TestDemoCheck(t *testing.T) {
	testutil.RequireOpenResty(t)
	bin := buildDemo(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append(demoArgs(t, dir), "--check")...).CombinedOutput()
	if err != nil {
		// The story says what failed; the first agent's log says why.
		agentLog, _ := os.ReadFile(filepath.Join(dir, logsDir, agentLog))
		t.Fatalf("demo --check: %v\n%s\nthe first agent's log:\n%s", err, out, agentLog)
	}
	for _, want := range []string{
		"hello from cellvisor", "status -o json", "enrolled as edge",
		"check 1/5: drain cell-01", "check 3/5: publish revision 2", "master pid",
		"restart refused by the rate limit: cell-01 had 3 restarts",
		"$CTL pool create reserved-demo --replicas 2 --drain 2s",
		"$CTL cell assign ", "cell-03 reserved-demo", "cell-04 reserved-demo",
		"$CTL domain publish reserved.cellvisor.test --pool reserved-demo",
		"placed on cell-03, cell-04",
		"is not reserved-demo's: HTTP 404",
		"$CTL domain move demo.cellvisor.test --to reserved-demo",
		"switched", "drained",
		"move shared-default → reserved-demo: done",
		"during the move, 0 failed",
		"demo.cellvisor.test: pool reserved-demo, revision 3 (was 2 in shared-default), served by cell-03 and cell-04",
		"$CTL frontdoor set ", "(https): https://shop.demo.example:443",
		"HTTPS://Shop.Demo.Example.:443/checkout -> edge ", "refused (unmapped)",
		"check: cell-01 resolves HTTPS://Shop.Demo.Example.:443/checkout to edge ",
		"https://API.demo.example/v1/orders -> edge ",
		"$CTL edge create --name demo-edge-2 --org demo --country US --continent NA --region us-east --slots 2",
		"hello from cellvisor: shared.cellvisor.test, shared-default on both edges",
		"$CTL egress leases --org demo",
		"metering direct (holds the lease)", "siem_forwarding direct (holds the lease)",
		"check: each class has exactly one holder, in its region, that both agents agree on; both edges' bundles of both classes were ingested",
		"demo check: every step worked",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	// The story is on stdout; the logs are in files, without colour codes,
	// and the demo says where.
	if strings.Contains(string(out), "\tINFO\t") || !strings.Contains(string(out), "logs of the control API and of both agents: ") {
		t.Errorf("demo output: want the story without log lines, and where the logs are:\n%s", out)
	}
	for _, name := range []string{controlLog, agentLog, edge2AgentLog} {
		b, err := os.ReadFile(filepath.Join(dir, logsDir, name))
		if err != nil || !strings.Contains(string(b), "\tINFO\t") || strings.Contains(string(b), "\x1b[") {
			t.Errorf("log %s: %v; want console logs without colour codes:\n%s", name, err, b)
		}
	}
	for _, f := range []string{agentPidFile, filepath.Join(edge2Dir, agentPidFile)} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("agent pid file %s after a clean stop: %v, want it removed", f, err)
		}
	}
	wantNoCells(t, dir)
}

// runningDemo is an interactive demo (no --check) started by a test.
type runningDemo struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    string // its stdout and stderr
}

func (d *runningDemo) output() string {
	b, _ := os.ReadFile(d.log)
	return string(b)
}

// startDemo starts an interactive demo and waits until it runs. Its output
// goes to a file, not a pipe: the agent it starts, and a killed demo's
// orphans, would hold a pipe open and keep Wait from returning.
func startDemo(t *testing.T, bin string, args []string) *runningDemo {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), "demo.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &runningDemo{cmd: cmd, exited: make(chan struct{}), log: logf.Name()}
	go func() {
		_ = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.stop(t, syscall.SIGINT)
		if t.Failed() {
			t.Logf("demo output:\n%s", d.output())
		}
	})
	// The demo's output is all there is to wait on.
	testutil.Eventually(t, 3*time.Minute, func() error {
		select {
		case <-d.exited:
			t.Fatalf("demo exited before it ran:\n%s", d.output())
		default:
		}
		if !strings.Contains(d.output(), "Running; press Ctrl-C") {
			return errors.New("demo not running yet")
		}
		return nil
	})
	return d
}

// stop signals the demo and waits, bounded, until it is reaped.
func (d *runningDemo) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.exited:
	case <-time.After(90 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		t.Errorf("demo did not exit within 90s of %v", sig)
	}
}

// A second demo on the same directory is refused before it touches
// anything: the first one keeps running and stays manageable.
func TestSecondDemoRefused(t *testing.T) {
	testutil.RequireOpenResty(t)
	bin := buildDemo(t)
	dir := t.TempDir()
	args := demoArgs(t, dir)
	first := startDemo(t, bin, args)
	agentPid := readAgentPid(t, dir)
	cellPid := cellMaster(t, dir, "cell-01")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append(args, "--check")...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another demo is running in this directory") ||
		!strings.Contains(string(out), fmt.Sprintf("pid %d", first.cmd.Process.Pid)) || !strings.Contains(string(out), "nothing was changed") {
		t.Fatalf("second demo: %v\n%s\nwant a refusal naming the first demo's pid %d", err, out, first.cmd.Process.Pid)
	}
	if got := readAgentPid(t, dir); got != agentPid || !testutil.Alive(agentPid) {
		t.Errorf("after the refusal: agent pid file says %d (was %d), alive %t", got, agentPid, testutil.Alive(agentPid))
	}
	if got := cellMaster(t, dir, "cell-01"); got != cellPid || !testutil.Alive(cellPid) {
		t.Errorf("after the refusal: cell-01's master is %d (was %d)", got, cellPid)
	}
	status, err := exec.CommandContext(ctx, filepath.Join(filepath.Dir(bin), "cellvisor"), "status", "--config", filepath.Join(dir, "agent.yaml")).CombinedOutput()
	if err != nil || !strings.Contains(string(status), "cell-01  shared-default      ready") {
		t.Errorf("the first demo's agent after the refusal: %v\n%s", err, status)
	}
	first.stop(t, syscall.SIGINT)
	if code := first.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("first demo exit code %d after Ctrl-C, want 0", code)
	}
	if testutil.Alive(agentPid) || testutil.Alive(cellPid) {
		t.Errorf("after Ctrl-C: agent %d alive %t, cell-01 %d alive %t", agentPid, testutil.Alive(agentPid), cellPid, testutil.Alive(cellPid))
	}
	wantNoCells(t, dir)
}

// A demo killed with SIGKILL takes its agents down with it (Pdeathsig):
// each agent stops its cells.
func TestKilledDemoStopsItsAgent(t *testing.T) {
	testutil.RequireOpenResty(t)
	bin := buildDemo(t)
	dir := t.TempDir()
	d := startDemo(t, bin, append(demoArgs(t, dir), "--verbose"))
	// --verbose: the agents' and the control API's log lines are in the
	// output too.
	testutil.Eventually(t, 10*time.Second, func() error {
		out := d.output()
		for _, want := range []string{"\tINFO\tcellvisor-control", "\tINFO\tsupervisor\t", "topology created"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("verbose demo output lacks %q", want)
			}
		}
		return nil
	})
	pids := map[string]int{
		"agent": readAgentPid(t, dir), "cell-01": cellMaster(t, dir, "cell-01"),
		"second agent": readAgentPid(t, filepath.Join(dir, edge2Dir)), "second edge's cell-01": cellMaster(t, filepath.Join(dir, edge2Dir), "cell-01"),
	}
	// The control API's data is in the demo's directory, where a killed
	// demo leaves it for the next one (and make clean), not in the system's
	// temporary directory, where nothing would ever remove it.
	if _, err := os.Stat(filepath.Join(dir, controlDir, "admin.token")); err != nil {
		t.Errorf("the control API's data is not in the demo's directory: %v", err)
	}
	d.stop(t, syscall.SIGKILL)
	testutil.Eventually(t, 60*time.Second, func() error {
		for what, pid := range pids {
			if testutil.Alive(pid) {
				return fmt.Errorf("%s (pid %d) still alive", what, pid)
			}
		}
		return nil
	})
	wantNoCells(t, dir)
}

// After a demo and its agent were both killed with SIGKILL, their cells run
// on unmanaged; the next demo finds and stops them instead of failing on
// their ports.
func TestDemoAfterSIGKILL(t *testing.T) {
	testutil.RequireOpenResty(t)
	bin := buildDemo(t)
	dir := t.TempDir()
	args := demoArgs(t, dir)
	d := startDemo(t, bin, args)
	agentPid := readAgentPid(t, dir)
	cellPid := cellMaster(t, dir, "cell-01")
	// Stopped first, the agent cannot act on the SIGTERM its parent's death
	// sends it; SIGKILL then ends it without stopping its cells.
	if err := syscall.Kill(agentPid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	d.stop(t, syscall.SIGKILL)
	if err := syscall.Kill(agentPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if testutil.Alive(agentPid) {
			return fmt.Errorf("agent %d still alive", agentPid)
		}
		return nil
	})
	if !testutil.Alive(cellPid) {
		t.Fatalf("cell-01 (pid %d) died with its agent: nothing left over to test", cellPid)
	}
	t.Cleanup(func() { // should the demo below fail to
		if testutil.Alive(cellPid) {
			_ = syscall.Kill(-cellPid, syscall.SIGKILL)
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append(args, "--check")...).CombinedOutput()
	if err != nil {
		agentLog, _ := os.ReadFile(filepath.Join(dir, logsDir, agentLog))
		t.Fatalf("demo after a killed one: %v\n%s\nthe first agent's log:\n%s", err, out, agentLog)
	}
	for _, want := range []string{
		fmt.Sprintf("cell-01 of an earlier demo is still running (nginx master pid %d): stopping it", cellPid),
		"demo check: every step worked",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, controlDir)); !os.IsNotExist(err) {
		t.Errorf("the control API's data of the killed demo or of this one is left in %s: %v", dir, err)
	}
	if testutil.Alive(cellPid) {
		t.Errorf("the earlier demo's cell-01 (pid %d) still runs", cellPid)
	}
	wantNoCells(t, dir)
}

func readAgentPid(t *testing.T, dir string) int {
	t.Helper()
	v := readPidFile(filepath.Join(dir, agentPidFile))
	if len(v) != 2 {
		t.Fatalf("agent pid file: %v", v)
	}
	return int(v[0])
}

// cellMaster is the pid in a cell's pid file.
func cellMaster(t *testing.T, dir, cell string) int {
	t.Helper()
	v := readPidFile(filepath.Join(dir, "run", cell, "nginx.pid"))
	if len(v) != 1 {
		t.Fatalf("%s pid file: %v", cell, v)
	}
	return int(v[0])
}

// wantNoCells checks no process of the demo in dir is left.
func wantNoCells(t *testing.T, dir string) {
	t.Helper()
	root, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if strings.Contains(string(b), root+"/") && testutil.Alive(pid) {
			t.Errorf("process %d of the demo is left: %q", pid, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	// Nor its agents' cgroup subtrees, in any v1 hierarchy this process is
	// in (where there is none, nothing is found).
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(self)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 || parts[1] == "" || strings.HasPrefix(parts[1], "name=") {
			continue
		}
		for _, sub := range []string{demoSubtree(root), edge2Subtree(root)} {
			d := filepath.Join("/sys/fs/cgroup", strings.Split(parts[1], ",")[0], parts[2], sub)
			if _, err := os.Stat(d); err == nil {
				t.Errorf("the demo's cgroup subtree is left: %s", d)
			}
		}
	}
}
