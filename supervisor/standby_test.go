package supervisor_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/cgroup"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// standbyOf waits until the cell's group holds a standby joined to every
// hierarchy, other than not, and returns its pid. It skips where cells are
// not joined by a helper (cgroup v2, unenforced).
func standbyOf(t *testing.T, h *harness, name string, not int) int {
	t.Helper()
	pid := standbyIn(t, h, name, not)
	if pid == 0 {
		t.Skip("standbys are for cells joined by a helper (cgroup v1)")
	}
	return pid
}

// standbyIn is standbyOf, but 0 where cells have no standby.
func standbyIn(t *testing.T, h *harness, name string, not int) int {
	t.Helper()
	g, err := h.cg.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := g.(cgroup.StandbyGroup); !ok {
		return 0
	}
	var pid int
	testutil.Eventually(t, 10*time.Second, func() error {
		pids, err := g.Procs()
		if err != nil {
			return err
		}
		for _, p := range pids {
			if p != not && isStandby(p) && joined(g, p) {
				pid = p
				return nil
			}
		}
		return fmt.Errorf("no standby joined in %s: %v", name, pids)
	})
	return pid
}

func isStandby(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.Contains(string(b), "cellvisor-standby")
}

func joined(g cgroup.Group, pid int) bool {
	for c, p := range g.Paths() {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", c, p, "cgroup.procs"))
		if err != nil || !slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid)) {
			return false
		}
	}
	return true
}

// nginxProcs are the cell's master and workers: its processes but the standby.
func nginxProcs(t *testing.T, h *harness, name string) []int {
	t.Helper()
	return slices.DeleteFunc(cellProcs(t, h, name), isStandby)
}

// A crashed cell's new master is its slot's standby, exec'd in place: the
// join (four v1 migrations) is off the crash path. The standby survives the
// kill of the crashed cell's leftovers, a fresh one is joined once the new
// master is ready, and none outlives the supervisor.
func TestCrashRestartExecsTheStandby(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 2})
	before := h.waitReady("cell-01", 0)
	spare := standbyOf(t, h, "cell-01", 0)
	if spare == before.PID {
		t.Fatalf("the standby %d is the master", spare)
	}
	crashed := nginxProcs(t, h, "cell-01")
	for _, pid := range crashed {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	after := h.waitReady("cell-01", before.PID)
	if after.PID != spare {
		t.Errorf("new master %d, want the standby %d exec'd in place", after.PID, spare)
	}
	if code, body, err := get(after.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
		t.Errorf("after the restart: %d %q %v", code, body, err)
	}
	next := standbyOf(t, h, "cell-01", spare)
	other := standbyOf(t, h, "cell-02", 0)
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range append(crashed, after.PID, next, other) {
		if testutil.Alive(pid) {
			t.Errorf("pid %d alive after stop", pid)
		}
	}
}

// A standby killed along with the cell (what an operator's kill of the whole
// group does) costs nothing but the fast path: the cell is started through
// a join as before.
func TestCrashWithStandbyGoneStillRestarts(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1})
	before := h.waitReady("cell-01", 0)
	spare := standbyOf(t, h, "cell-01", 0)
	killCell(t, h, "cell-01")
	after := h.waitReady("cell-01", before.PID)
	if after.Restarts != before.Restarts+1 {
		t.Errorf("restarts %d, want %d", after.Restarts, before.Restarts+1)
	}
	if after.PID == spare {
		t.Errorf("new master %d is the killed standby's pid", after.PID)
	}
	if code, _, err := get(after.HTTPPort, "/"); err != nil || code != 200 {
		t.Errorf("after the restart: %d %v", code, err)
	}
}

// A standby that hangs (stopped) is not released into: the crashed cell is
// started through a join at once instead of waiting out its readiness
// timeout behind a helper that never execs, and the stopped standby is
// killed and reaped.
func TestCrashWithStandbyStoppedStartsThroughAJoin(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1})
	before := h.waitReady("cell-01", 0)
	spare := standbyOf(t, h, "cell-01", 0)
	signal(t, syscall.SIGSTOP, spare)
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	after := h.waitReady("cell-01", before.PID)
	if after.PID == spare {
		t.Errorf("new master %d is the stopped standby's pid", after.PID)
	}
	if after.Restarts != before.Restarts+1 {
		t.Errorf("restarts %d, want %d: the first start after the crash should serve", after.Restarts, before.Restarts+1)
	}
	if testutil.Alive(spare) {
		t.Errorf("the stopped standby %d is still alive", spare)
	}
}

// A supervisor that leaves its cells to the next one ends its standbys; the
// next adopts the masters around them. An adopted master holds the only
// copies of its listeners, so its crash restart binds them anew through a
// join; the master it starts gets a standby, which the next crash uses.
func TestAdoptionWithStandbys(t *testing.T) {
	// Healthy after 50ms of readiness: the second crash, too, is
	// restarted at once (with backoff the standby would be dropped).
	h := newHarness(t, harnessOpts{slots: 1,
		policy: supervisor.Policy{Initial: 10 * time.Millisecond, Max: time.Second, HealthyAfter: 50 * time.Millisecond}})
	one := h.waitReady("cell-01", 0)
	spare := standbyOf(t, h, "cell-01", 0)
	h.leaveAndRestart()
	if testutil.Alive(spare) {
		t.Errorf("the previous supervisor's standby %d outlived it", spare)
	}
	got := h.waitReady("cell-01", 0)
	if got.PID != one.PID {
		t.Fatalf("pid %d, want the running master %d adopted", got.PID, one.PID)
	}
	for _, pid := range nginxProcs(t, h, "cell-01") {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	two := h.waitReady("cell-01", one.PID)
	next := standbyOf(t, h, "cell-01", spare)
	testutil.Eventually(t, 10*time.Second, func() error {
		if s := h.slot("cell-01"); s.ReadySince == nil || time.Since(*s.ReadySince) < 100*time.Millisecond {
			return fmt.Errorf("ready since %v: not yet healthy", s.ReadySince)
		}
		return nil
	})
	for _, pid := range nginxProcs(t, h, "cell-01") {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if after := h.waitReady("cell-01", two.PID); after.PID != next {
		t.Errorf("the restarted cell's next restart: master %d, want its standby %d", after.PID, next)
	}
	if code, body, err := get(got.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
		t.Errorf("after two restarts: %d %q %v", code, body, err)
	}
}
