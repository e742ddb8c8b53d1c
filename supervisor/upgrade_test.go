package supervisor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// load sends requests to ports, one after the other per port, until stop
// is called, which returns how many were sent and how many failed (an
// error, or not 200 "hello").
func load(t *testing.T, ports ...int) (stop func() (sent, failed int64, first string)) {
	t.Helper()
	return loadOn(t, "/", "hello", ports...)
}

// loadOn is load of path, where an answer fails unless 200 with body
// (any body where body is "").
func loadOn(t *testing.T, path, body string, ports ...int) (stop func() (sent, failed int64, first string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var sent, failed atomic.Int64
	var mu sync.Mutex
	var firstErr string
	var wg sync.WaitGroup
	for _, port := range ports {
		wg.Go(func() {
			for ctx.Err() == nil {
				code, got, err := get(port, path)
				sent.Add(1)
				if err != nil || code != 200 || (body != "" && got != body) {
					failed.Add(1)
					mu.Lock()
					if firstErr == "" {
						firstErr = fmt.Sprintf("port %d: %d %q %v", port, code, got, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	var once sync.Once
	stop = func() (int64, int64, string) {
		once.Do(func() { cancel(); wg.Wait() })
		mu.Lock()
		defer mu.Unlock()
		return sent.Load(), failed.Load(), firstErr
	}
	t.Cleanup(func() { stop() })
	return stop
}

// exeOf is what /proc says pid executes.
func exeOf(pid int) string {
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return err.Error()
	}
	return exe
}

// A binary replaced while the cells serve is noticed (fsnotify), verified,
// and every cell is restarted onto it, one at a time: no request fails, the
// pool never has both cells down, and each cell's master then executes the
// new file.
func TestRollsCellsOntoAReplacedBinary(t *testing.T) {
	bin := copyBinary(t)
	h := newHarness(t, harnessOpts{slots: 2, assign: allAssigned(2), binary: bin})
	before := map[string]supervisor.SlotStatus{}
	var ports []int
	for _, name := range []string{"cell-01", "cell-02"} {
		before[name] = h.waitReady(name, 0)
		ports = append(ports, before[name].HTTPPort)
	}
	stop := load(t, ports...)
	// Watch the pool while the roll runs: never both cells not ready.
	var both atomic.Bool
	wctx, wcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for wctx.Err() == nil {
			down := 0
			for _, s := range h.sup.Status().Slots {
				if s.State != supervisor.StateReady {
					down++
				}
			}
			if down > 1 {
				both.Store(true)
			}
			time.Sleep(5 * time.Millisecond) // sampling, not synchronisation
		}
	})
	t.Cleanup(func() { wcancel(); wg.Wait() })

	original, _ := testutil.RequireOpenResty(t)
	installBinary(t, original, bin)
	testutil.Eventually(t, 60*time.Second, func() error {
		st := h.sup.Status()
		if st.Runtime.Superseded != 0 || st.Runtime.Upgrade != supervisor.UpgradeIdle {
			return fmt.Errorf("runtime %+v, want every cell rolled", *st.Runtime)
		}
		for _, s := range st.Slots {
			if s.State != supervisor.StateReady || s.PID == before[s.Name].PID {
				return fmt.Errorf("%s: %s pid %d, want a new master ready", s.Name, s.State, s.PID)
			}
		}
		return nil
	})
	// A little more load on the new masters, then the count.
	sent, failed, first := stop()
	wcancel()
	wg.Wait()
	if failed != 0 {
		t.Errorf("%d of %d requests failed during the roll; first: %s", failed, sent, first)
	}
	t.Logf("%d requests during the roll, %d failed", sent, failed)
	if sent < 10 {
		t.Errorf("only %d requests sent during the roll", sent)
	}
	if both.Load() {
		t.Error("both cells of the pool were down at once during the roll")
	}
	for _, s := range h.sup.Status().Slots {
		if exe := exeOf(s.PID); exe != bin {
			t.Errorf("%s: master %d runs %q, want the new %s", s.Name, s.PID, exe, bin)
		}
		if s.Runtime == nil || s.Runtime.Superseded || s.Runtime.Version == "" {
			t.Errorf("%s: runtime %+v, want the new binary's version, not superseded", s.Name, s.Runtime)
		}
		if s.OperatorRestarts != 0 {
			t.Errorf("%s: %d operator restarts, want the roll not counted as one", s.Name, s.OperatorRestarts)
		}
	}
}

// fakeBinary writes, over bin as a package upgrade would, a binary that
// says a version but refuses every configuration as an incompatible module.
func fakeBinary(t *testing.T, bin string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(bin), "fake.dpkg-new")
	script := `#!/bin/sh
case " $* " in
*" -v "*) echo "nginx version: nginx/9.9.9" >&2; exit 0;;
*" -t "*) echo "nginx: [emerg] module \"/usr/lib/nginx/modules/ndk_http_module.so\" is not binary compatible" >&2; exit 1;;
esac
exit 1
`
	if err := os.WriteFile(tmp, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
}

// A new binary that refuses the cells' configuration (an incompatible
// module) is refused before any cell is touched: every cell keeps its
// master and serves, and status and the log say why.
func TestRefusedBinaryTouchesNoCell(t *testing.T) {
	bin := copyBinary(t)
	h := newHarness(t, harnessOpts{slots: 2, assign: allAssigned(2), binary: bin})
	one := h.waitReady("cell-01", 0)
	two := h.waitReady("cell-02", 0)
	fakeBinary(t, bin)
	h.sup.CheckRuntime()
	var st supervisor.Status
	testutil.Eventually(t, 30*time.Second, func() error {
		st = h.sup.Status()
		if st.Runtime.Upgrade != supervisor.UpgradeRefused {
			return fmt.Errorf("runtime %+v, want the new binary refused", *st.Runtime)
		}
		return nil
	})
	if r := st.Runtime; !strings.Contains(r.Reason, "not binary compatible") || r.Version != "nginx/9.9.9" || r.Superseded != 2 {
		t.Errorf("runtime %+v, want the binary's refusal as the reason, its version, 2 cells on the old one", *r)
	}
	for _, want := range []supervisor.SlotStatus{one, two} {
		got := h.slot(want.Name)
		if got.PID != want.PID || got.State != supervisor.StateReady || got.Restarts != 0 {
			t.Errorf("%s: %s pid %d restarts %d, want the old master %d untouched", got.Name, got.State, got.PID, got.Restarts, want.PID)
		}
		if code, body, err := get(got.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
			t.Errorf("%s: %d %q %v", got.Name, code, body, err)
		}
	}
}

// A module file replaced by a package (the Lua module's own package) leaves
// the masters mapping the old one: they are rolled too, and the new masters
// map the new file.
func TestRollsCellsOntoAReplacedModule(t *testing.T) {
	mods, copies := hostModules(t, t.TempDir())
	h := newHarness(t, harnessOpts{slots: 1, assign: allAssigned(1), modules: copies})
	before := h.waitReady("cell-01", 0)
	lua := copies[len(copies)-1]
	installBinary(t, mods[len(mods)-1], lua)
	h.sup.CheckRuntime()
	after := h.waitReady("cell-01", before.PID)
	maps, err := os.ReadFile("/proc/" + strconv.Itoa(after.PID) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(maps), " "+lua+"\n") || strings.Contains(string(maps), lua+" (deleted)") {
		t.Errorf("the new master %d does not map the new %s", after.PID, lua)
	}
	if after.Runtime == nil || after.Runtime.Superseded {
		t.Errorf("runtime %+v, want not superseded", after.Runtime)
	}
}

// Adopted masters whose parent is still the process that started them (here:
// the test, which runs both supervisors) ignore nginx's USR2: the roll
// restarts them instead, and every cell ends on the new binary.
// cmd/cellvisor's TestRuntimeUpgradeAfterAgentKill has the real agent
// killed, where USR2 is taken.
func TestRollsAdoptedCellsThatIgnoreUSR2(t *testing.T) {
	bin := copyBinary(t)
	h := newHarness(t, harnessOpts{slots: 2, assign: allAssigned(2), binary: bin})
	before := map[string]supervisor.SlotStatus{}
	for _, name := range []string{"cell-01", "cell-02"} {
		before[name] = h.waitReady(name, 0)
	}
	supervisor.Leave(h.sup)
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	original, _ := testutil.RequireOpenResty(t)
	installBinary(t, original, bin)
	h.restart()
	testutil.Eventually(t, 60*time.Second, func() error {
		st := h.sup.Status()
		if st.Runtime.Superseded != 0 || st.Runtime.Upgrade != supervisor.UpgradeIdle {
			return fmt.Errorf("runtime %+v, want every cell rolled", *st.Runtime)
		}
		for _, s := range st.Slots {
			if s.State != supervisor.StateReady || s.PID == before[s.Name].PID {
				return fmt.Errorf("%s: %s pid %d, want a new master ready", s.Name, s.State, s.PID)
			}
		}
		return nil
	})
	for _, s := range h.sup.Status().Slots {
		if exe := exeOf(s.PID); exe != bin {
			t.Errorf("%s: master %d runs %q, want the new %s", s.Name, s.PID, exe, bin)
		}
		if testutil.Alive(before[s.Name].PID) {
			t.Errorf("%s: the old master %d still runs", s.Name, before[s.Name].PID)
		}
	}
}

// Under runtime_upgrade: manual a replaced binary only makes the cells
// superseded, waiting; a dry run says what a roll would do (each cell and
// how) and changes nothing; the operator's roll then moves every cell. A
// refused binary's dry run says why and would touch nothing.
func TestManualPolicyWaitsForTheOperator(t *testing.T) {
	bin := copyBinary(t)
	h := newHarness(t, harnessOpts{slots: 2, assign: allAssigned(2), binary: bin, upgrade: supervisor.UpgradeManual})
	one := h.waitReady("cell-01", 0)
	two := h.waitReady("cell-02", 0)
	original, _ := testutil.RequireOpenResty(t)
	installBinary(t, original, bin)
	testutil.Eventually(t, 30*time.Second, func() error {
		if r := h.sup.Status().Runtime; r.Upgrade != supervisor.UpgradeWaiting || r.Superseded != 2 {
			return fmt.Errorf("runtime %+v, want 2 cells waiting for the operator", *r)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	plan, err := h.sup.UpgradeRuntime(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if !plan.Verified || plan.Started || len(plan.Cells) != 2 || plan.Cells[0].Name != "cell-01" || plan.Cells[0].How != supervisor.HowRestart || plan.Cells[0].PID != one.PID {
		t.Errorf("dry run %+v, want both cells verified, by restart, nothing started", plan)
	}
	for _, want := range []supervisor.SlotStatus{one, two} {
		if got := h.slot(want.Name); got.PID != want.PID {
			t.Errorf("%s: pid %d after the dry run, want %d", got.Name, got.PID, want.PID)
		}
	}
	if plan, err = h.sup.UpgradeRuntime(ctx, false); err != nil || !plan.Started {
		t.Fatalf("roll: %+v %v, want it started", plan, err)
	}
	h.waitReady("cell-01", one.PID)
	h.waitReady("cell-02", two.PID)
	testutil.Eventually(t, 30*time.Second, func() error {
		if r := h.sup.Status().Runtime; r.Upgrade != supervisor.UpgradeIdle || r.Superseded != 0 {
			return fmt.Errorf("runtime %+v, want every cell rolled", *r)
		}
		return nil
	})

	fakeBinary(t, bin)
	plan, err = h.sup.UpgradeRuntime(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Verified || !strings.Contains(plan.Error, "not binary compatible") || len(plan.Cells) != 2 {
		t.Errorf("dry run of a refused binary %+v, want it refused with the binary's message", plan)
	}
}
