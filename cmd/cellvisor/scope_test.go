package main

import (
	"crypto/rand"
	"encoding/hex"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/internal/fakesystemd"
	"cellvisor/sdscope"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

const scopeUnit = "cellvisor.service"

// scopeFixture is an agent configuration with cgroup.scope: on, a private
// bus with the fake systemd on it, and the environment that makes the agent
// believe systemd started it.
type scopeFixture struct {
	bin, cfgPath string
	cfg          config.Agent
	sd           *fakesystemd.Systemd
	env          []string
	scopeCG      string
}

func newScopeFixture(t *testing.T) *scopeFixture {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireCgroups(t)
	f := &scopeFixture{bin: buildAgent(t)}
	f.cfgPath, _ = agentConfig(t, 2, "")
	b, err := os.ReadFile(f.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.cfgPath, []byte(strings.Replace(string(b), "scope: off", "scope: on", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if f.cfg, err = config.Load(f.cfgPath); err != nil {
		t.Fatal(err)
	}
	addr := fakesystemd.StartBus(t)
	rb := make([]byte, 4)
	_, _ = rand.Read(rb)
	slice := "cvscope" + hex.EncodeToString(rb) + ".slice"
	f.sd = fakesystemd.Start(t, fakesystemd.Options{Address: addr, Unit: scopeUnit, Slice: slice})
	f.env = []string{"DBUS_SYSTEM_BUS_ADDRESS=" + addr, "INVOCATION_ID=0123456789abcdef"}
	f.scopeCG = "/" + slice + "/" + sdscope.ScopeName(scopeUnit)
	return f
}

// start runs an agent and checks its cells run below the scope.
func (f *scopeFixture) start(t *testing.T) (*runningAgent, supervisor.Status, map[string]int) {
	t.Helper()
	a, st := startAgent(t, f.bin, f.cfgPath, f.cfg, f.env...)
	if st.CgroupMode == cgroup.ModeUnenforced {
		t.Skipf("cell limits cannot be enforced here: %s", st.Refusal)
	}
	pids := readyPIDs(st)
	if len(pids) != 2 {
		t.Fatalf("ready cells %v, want cell-01 and cell-02", pids)
	}
	for _, s := range st.Slots {
		if s.PID != 0 && !strings.HasPrefix(s.Cgroup, f.scopeCG+"/") {
			t.Errorf("%s runs in %s, want below the scope %s", s.Name, s.Cgroup, f.scopeCG)
		}
	}
	return a, st, pids
}

func (f *scopeFixture) holders() []int { return sdscope.Holders("/sys/fs/cgroup", f.scopeCG) }

// serves checks every cell answers its readiness check over loopback.
func serves(t *testing.T, st supervisor.Status) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, s := range st.Slots {
		if s.PID == 0 {
			continue
		}
		resp, err := hc.Get("http://127.0.0.1:" + strconv.Itoa(s.HTTPPort) + "/.cellvisor/ready")
		if err != nil {
			t.Errorf("%s: %v", s.Name, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s answers %s", s.Name, resp.Status)
		}
	}
}

func countCalls(calls []string, prefix string) int {
	n := 0
	for _, c := range calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// Under systemd, a SIGTERM during a restart job of the unit leaves the cells
// serving in their scope (same masters, the holder still there); the next
// agent finds the scope by name and adopts them. A SIGTERM during a stop job
// stops them gracefully and ends the holder and the scope.
func TestScopeRestartKeepsCellsStopStopsThem(t *testing.T) {
	f := newScopeFixture(t)
	a, st, pids := f.start(t)
	holders := f.holders()
	if len(holders) != 1 {
		t.Fatalf("holders %v, want one", holders)
	}

	f.sd.SetJob(scopeUnit, "restart")
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit code %d after SIGTERM in a restart job, want 0", code)
	}
	f.sd.SetJob(scopeUnit, "")
	for name, pid := range pids {
		if !testutil.Alive(pid) {
			t.Errorf("%s master %d died with the agent in a restart", name, pid)
		}
	}
	// The agent is gone: the cells answer by themselves.
	serves(t, st)
	for _, pid := range holders {
		if !testutil.Alive(pid) {
			t.Errorf("holder %d died with the agent in a restart", pid)
		}
	}

	b, st2 := startAgent(t, f.bin, f.cfgPath, f.cfg, f.env...)
	serves(t, st2)
	if got := readyPIDs(st2); !maps.Equal(got, pids) {
		t.Errorf("after the restart masters %v, want the same %v (adopted)", got, pids)
	}
	if n := countCalls(f.sd.Calls(), "StartTransientUnit"); n != 1 {
		t.Errorf("StartTransientUnit called %d times, want once (the next agent finds the scope): %v", n, f.sd.Calls())
	}
	if got := f.holders(); !slices.Equal(got, holders) {
		t.Errorf("holders %v after the restart, want %v", got, holders)
	}

	f.sd.SetJob(scopeUnit, "stop")
	if code := b.stop(t); code != 0 {
		t.Errorf("agent exit code %d after SIGTERM in a stop job, want 0", code)
	}
	noneSurvived(t, pids, holders, "a stop")
	if _, active := f.sd.Scope(sdscope.ScopeName(scopeUnit)); active {
		t.Error("scope still active after a stop")
	}
	if log := readLog(t, b); !strings.Contains(log, `"job": "stop"`) && !strings.Contains(log, `"job":"stop"`) {
		t.Errorf("the stopped agent's log does not name the stop job:\n%s", log)
	}
}

// cellvisor shutdown stops the cells even while systemd runs a restart job.
func TestScopeShutdownStopsCells(t *testing.T) {
	f := newScopeFixture(t)
	a, _, pids := f.start(t)
	holders := f.holders()
	f.sd.SetJob(scopeUnit, "restart")
	out, err := exec.Command(f.bin, "--config", f.cfgPath, "shutdown").CombinedOutput()
	if err != nil {
		t.Fatalf("shutdown: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ended") {
		t.Errorf("shutdown printed %q, want it to say the agent ended", out)
	}
	select {
	case <-a.exited:
		if code := a.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("agent exit code %d after shutdown, want 0", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent still running 30s after shutdown returned")
	}
	noneSurvived(t, pids, holders, "shutdown")
}

// When systemd cannot be asked what the SIGTERM is for, the cells stop (the
// documented default): cells never run on unsupervised behind an agent
// that may not come back.
func TestScopeBusGoneStopsCells(t *testing.T) {
	f := newScopeFixture(t)
	a, _, pids := f.start(t)
	holders := f.holders()
	f.sd.SetJob(scopeUnit, "restart")
	f.sd.Disconnect()
	if code := a.stop(t); code != 0 {
		t.Errorf("agent exit code %d, want 0", code)
	}
	noneSurvived(t, pids, holders, "a SIGTERM systemd could not explain")
	if log := readLog(t, a); !strings.Contains(log, "cannot tell a stop from a restart") {
		t.Errorf("log lacks the reason the cells stopped:\n%s", log)
	}
}

func readLog(t *testing.T, a *runningAgent) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Clean(a.log))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// noneSurvived checks that no cell master and no scope holder outlived
// what (the agent's end, named for the messages).
func noneSurvived(t *testing.T, masters map[string]int, holders []int, what string) {
	t.Helper()
	for name, pid := range masters {
		if testutil.Alive(pid) {
			t.Errorf("%s master %d survived %s", name, pid, what)
		}
	}
	for _, pid := range holders {
		if testutil.Alive(pid) {
			t.Errorf("holder %d survived %s", pid, what)
		}
	}
}
