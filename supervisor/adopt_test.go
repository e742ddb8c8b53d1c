package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"cellvisor/agent"
	"cellvisor/domain"
	"cellvisor/runtime"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// leaveAndRestart ends h's supervisor as a killed agent would (its cells keep
// running) and starts a new one on the same state.
func (h *harness) leaveAndRestart() {
	h.t.Helper()
	supervisor.Leave(h.sup)
	h.restart()
}

// A restarted agent adopts the running cells: the same masters keep serving,
// restart counts and the operator-restart rate limit are resumed, and an
// adopted master that dies is restarted like any other.
func TestAdoptsRunningCells(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 2, assign: allAssigned(2), limit: 1})
	one := h.waitReady("cell-01", 0)
	two := h.waitReady("cell-02", 0)
	// One operator restart of cell-01 (the limit), one crash of cell-02.
	if _, err := h.sup.Restart(context.Background(), "cell-01"); err != nil {
		t.Fatal(err)
	}
	one = h.waitReady("cell-01", one.PID)
	if err := syscall.Kill(two.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	two = h.waitReady("cell-02", two.PID)

	h.leaveAndRestart()
	for _, want := range []struct {
		st                 supervisor.SlotStatus
		restarts, operator int
	}{{one, 0, 1}, {two, 1, 0}} {
		got := h.slot(want.st.Name)
		if got.State != supervisor.StateReady || got.PID != want.st.PID {
			t.Errorf("%s: %s pid %d, want the running master %d adopted and ready", got.Name, got.State, got.PID, want.st.PID)
		}
		if got.Restarts != want.restarts || got.OperatorRestarts != want.operator {
			t.Errorf("%s: restarts %d, operator restarts %d, want %d and %d resumed", got.Name, got.Restarts, got.OperatorRestarts, want.restarts, want.operator)
		}
		if code, body, err := get(got.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
			t.Errorf("%s after adoption: %d %q %v", got.Name, code, body, err)
		}
	}
	if _, err := h.sup.Restart(context.Background(), "cell-01"); !errors.Is(err, supervisor.ErrRateLimited) {
		t.Errorf("restart past the limit after an agent restart: %v, want ErrRateLimited", err)
	}
	// The adopted master dies: it is a crash like any other.
	procs := nginxProcs(t, h, "cell-02") // its standby becomes the new master
	if err := syscall.Kill(two.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	after := h.waitReady("cell-02", two.PID)
	if after.Restarts != 2 {
		t.Errorf("restarts after the adopted master died: %d, want 2", after.Restarts)
	}
	for _, pid := range procs {
		if testutil.Alive(pid) {
			t.Errorf("pid %d of the dead adopted cell still alive", pid)
		}
	}
}

// A pid file naming an unrelated live process or another slot's master is
// never adopted nor signalled: that slot gets a fresh cell, the process
// named lives on, and the other slot's master is adopted by its own slot.
func TestPidFileNamingAnotherProcessNotAdopted(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 3, assign: allAssigned(3)})
	before := map[string]int{}
	for _, name := range []string{"cell-01", "cell-02", "cell-03"} {
		before[name] = h.waitReady(name, 0).PID
	}
	sleep := exec.Command("sleep", "1000")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = sleep.Wait(); close(exited) }()
	t.Cleanup(func() { _ = sleep.Process.Kill(); <-exited })

	supervisor.Leave(h.sup)
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	write := func(slot string, pid int) {
		if err := os.WriteFile(h.slotSpec(slot).PidFile(), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("cell-02", before["cell-01"])
	write("cell-03", sleep.Process.Pid)
	h.restart()

	if got := h.waitReady("cell-01", 0); got.PID != before["cell-01"] {
		t.Errorf("cell-01: pid %d, want its master %d adopted (another slot's pid file named it)", got.PID, before["cell-01"])
	}
	for _, name := range []string{"cell-02", "cell-03"} {
		if got := h.waitReady(name, before[name]); got.PID == before["cell-01"] || got.PID == sleep.Process.Pid {
			t.Errorf("%s adopted pid %d named by its forged pid file", name, got.PID)
		}
	}
	select {
	case <-exited:
		t.Errorf("the unrelated process named by a pid file was signalled: %v", sleep.ProcessState)
	default:
	}
	if !testutil.Alive(before["cell-01"]) {
		t.Errorf("cell-01's master %d was signalled", before["cell-01"])
	}
}

// BenchmarkAdopt8: a new supervisor's start until its 8 running cells are
// adopted, verified and probed ready.
func BenchmarkAdopt8(b *testing.B) {
	h := prepareHarness(b, 8)
	h.start()
	pids := map[string]int{}
	for _, s := range h.sup.Status().Slots {
		pids[s.Name] = s.PID
	}
	for b.Loop() {
		b.StopTimer()
		supervisor.Leave(h.sup)
		if err := h.stop(); err != nil {
			b.Fatal(err)
		}
		sup, err := supervisor.New(h.opts)
		if err != nil {
			b.Fatal(err)
		}
		h.sup = sup
		h.ctx, h.cancel = context.WithCancel(context.Background())
		b.StartTimer()
		h.start()
		b.StopTimer()
		for _, s := range h.sup.Status().Slots {
			if s.PID != pids[s.Name] || s.State != supervisor.StateReady {
				b.Fatalf("%s: %s pid %d, want %d adopted", s.Name, s.State, s.PID, pids[s.Name])
			}
		}
		b.StartTimer()
	}
}

// Update gives running cells' cgroups new limits without restarting them.
func TestUpdateLimitsOfRunningCells(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1})
	before := h.waitReady("cell-01", 0)
	l := h.opts.Limits
	l.PIDs, l.MemoryBytes = l.PIDs+7, l.MemoryBytes+(1<<20)
	if err := h.sup.Update(context.Background(), supervisor.Settings{Limits: l}); err != nil {
		t.Fatal(err)
	}
	g, err := h.cg.Open("cell-01")
	if err != nil {
		t.Fatal(err)
	}
	got, err := g.Limits()
	if err != nil {
		t.Fatal(err)
	}
	if got.PIDs != l.PIDs || got.MemoryBytes != l.MemoryBytes {
		t.Errorf("cgroup limits %+v, want pids %d memory %d", got, l.PIDs, l.MemoryBytes)
	}
	if after := h.slot("cell-01"); after.PID != before.PID || after.Restarts != 0 {
		t.Errorf("pid %d (was %d), restarts %d: the cell restarted", after.PID, before.PID, after.Restarts)
	}
}

// An adopted cell that runs an older release than the slot's active one (the
// killed agent switched it but never reloaded the cell) is reloaded, not
// restarted, before it counts as ready.
func TestAdoptedCellLoadsTheActiveRelease(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, assign: allAssigned(1)})
	before := h.waitReady("cell-01", 0)
	supervisor.Leave(h.sup)
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	s := h.slotSpec("cell-01")
	pools, err := runtime.CompilePools([]domain.Domain{{
		Domain: testHost, Pool: domain.PoolSharedDefault, Revision: 2, Hostnames: []string{testHost},
		Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: "two"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.BuildRelease(agent.RenderParams(h.cfg, s, domain.PoolSharedDefault, 2), pools[domain.PoolSharedDefault])
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runtime.Activate(s, r); err != nil {
		t.Fatal(err)
	}
	if _, body, err := get(s.HTTPPort, "/"); err != nil || body != "hello" {
		t.Fatalf("before the new agent: %q %v, want the old release's answer", body, err)
	}
	h.restart()
	testutil.Eventually(t, 30*time.Second, func() error {
		seq, _, err := h.sup.Loaded(context.Background(), "cell-01")
		if err != nil || seq != 2 {
			return fmt.Errorf("loaded %d (%v), want 2", seq, err)
		}
		return nil
	})
	if _, body, err := get(s.HTTPPort, "/"); err != nil || body != "two" {
		t.Errorf("after adoption: %q %v, want the active release's answer", body, err)
	}
	if after := h.slot("cell-01"); after.PID != before.PID {
		t.Errorf("pid %d, was %d: the adopted cell was restarted, not reloaded", after.PID, before.PID)
	}
}
