package cgroup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cellvisor/cgroup"
	"cellvisor/testkit/testutil"
)

// cellLimits are the shipped per-cell limits.
var cellLimits = cgroup.Limits{MemoryBytes: 512 << 20, CPUQuotaUS: 50000, CPUPeriodUS: 100000, PIDs: 128, CPUBurstUS: 50000}

// rawLimits reads the limit files directly, per mode.
func rawLimits(t *testing.T, m cgroup.Manager, g cgroup.Group) map[string]string {
	t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	root := "/sys/fs/cgroup"
	switch m.Mode() {
	case cgroup.ModeV2:
		d := filepath.Join(root, g.Path())
		return map[string]string{"memory.max": read(d + "/memory.max"), "cpu.max": read(d + "/cpu.max"), "pids.max": read(d + "/pids.max")}
	case cgroup.ModeV1Hybrid:
		rel := strings.TrimPrefix(g.Path(), m.Path())
		base := func(c string) string { return filepath.Join(root, c, ownV1(t, c), filepath.Base(m.Path()), rel) }
		return map[string]string{
			"memory.limit_in_bytes": read(base("memory") + "/memory.limit_in_bytes"),
			"cpu.cfs_quota_us":      read(base("cpu") + "/cpu.cfs_quota_us"),
			"cpu.cfs_period_us":     read(base("cpu") + "/cpu.cfs_period_us"),
			"pids.max":              read(base("pids") + "/pids.max"),
		}
	}
	t.Fatalf("mode %s", m.Mode())
	return nil
}

func ownV1(t *testing.T, controller string) string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 {
			for _, c := range strings.Split(f[1], ",") {
				if c == controller {
					return f[2]
				}
			}
		}
	}
	t.Fatalf("no %s cgroup", controller)
	return ""
}

func TestCellCgroupHoldsExactLimits(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, err := m.Ensure("cell-01", cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	got := rawLimits(t, m, g)
	want := map[cgroup.Mode]map[string]string{
		cgroup.ModeV2:       {"memory.max": "536870912", "cpu.max": "50000 100000", "pids.max": "128"},
		cgroup.ModeV1Hybrid: {"memory.limit_in_bytes": "536870912", "cpu.cfs_quota_us": "50000", "cpu.cfs_period_us": "100000", "pids.max": "128"},
	}[m.Mode()]
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	l, err := g.Limits()
	if err != nil {
		t.Fatal(err)
	}
	wantL := cellLimits
	if l.CPUBurstUS == 0 {
		wantL.CPUBurstUS = 0 // a kernel without CPU burst
	}
	if l != wantL {
		t.Errorf("Limits() = %+v, want %+v", l, wantL)
	}
	names, err := m.List()
	if err != nil || len(names) != 1 || names[0] != "cell-01" {
		t.Errorf("List() = %v, %v; want [cell-01]", names, err)
	}
}

// A cell's CPU limit lowered live (Supervisor.Update) is applied: the agent
// gives a cell a burst equal to its quota, and the kernel refuses a quota
// below the burst already there, so the old burst must not stand in the
// way. Raised again, it is applied too.
func TestEnsureLowersAndRaisesTheCPULimit(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, err := m.Ensure("cell-03", cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := g.Limits(); err != nil || l.CPUBurstUS == 0 {
		t.Skipf("no CPU burst on this kernel (%+v, %v): nothing can stand in the way", l, err)
	}
	for _, quota := range []int64{25000, 75000, -1} {
		want := cellLimits
		want.CPUQuotaUS, want.CPUBurstUS = quota, uint64(max(quota, 0))
		if _, err := m.Ensure("cell-03", want); err != nil {
			t.Fatalf("quota %d: %v", quota, err)
		}
		got, err := g.Limits()
		if err != nil {
			t.Fatal(err)
		}
		if got.CPUQuotaUS != want.CPUQuotaUS || got.CPUBurstUS != want.CPUBurstUS {
			t.Errorf("quota %d: limits read back %+v", quota, got)
		}
	}
}

// Ensure on an existing group updates its limits in place, a period
// lowered below the quota already there included (a quota above the
// period is 2 CPUs here, which the kernel takes under an unlimited parent).
func TestEnsureUpdatesLimitsInPlace(t *testing.T) {
	m := testutil.RequireCgroups(t)
	if _, err := m.Ensure("cell-01", cellLimits); err != nil {
		t.Fatal(err)
	}
	want := cgroup.Limits{MemoryBytes: 256 << 20, CPUQuotaUS: 80000, CPUPeriodUS: 40000, PIDs: 64, CPUBurstUS: 50000}
	g, err := m.Ensure("cell-01", want)
	if err != nil {
		t.Fatal(err)
	}
	l, err := g.Limits()
	if err != nil {
		t.Fatal(err)
	}
	if l.CPUBurstUS == 0 {
		want.CPUBurstUS = 0 // a kernel without CPU burst
	}
	if l != want {
		t.Errorf("Limits() = %+v, want %+v", l, want)
	}
}

// The cell is inside its cgroup from its first instruction: the exec'd
// program itself reads its own membership.
func TestProcessStartsInsideCgroup(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, err := m.Ensure("cell-02", cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/cat", "/proc/self/cgroup")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cgroup.Start(g, cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	controllers := map[cgroup.Mode][]string{cgroup.ModeV2: {""}, cgroup.ModeV1Hybrid: {"memory", "cpu", "pids"}}[m.Mode()]
	for _, c := range controllers {
		found := false
		for _, line := range strings.Split(out.String(), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) == 3 && strings.HasSuffix(f[2], g.Path()[len(m.Path()):]) && hasController(f[1], c) {
				found = true
			}
		}
		if !found {
			t.Errorf("controller %q: process not in %s:\n%s", c, g.Path(), out.String())
		}
	}
}

func hasController(list, c string) bool {
	if c == "" {
		return list == ""
	}
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// shAndTwoSleeps creates the group name and starts a shell in it with two
// children, waiting until all three are members: their pids, and a channel
// closed once the shell exited.
func shAndTwoSleeps(t *testing.T, m cgroup.Manager, name string) (cgroup.Group, []int, <-chan struct{}) {
	t.Helper()
	g, err := m.Ensure(name, cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	_, exited := testutil.StartIn(t, g, "/bin/sh", "-c", "sleep 1000 & sleep 1000 & wait")
	var pids []int
	testutil.Eventually(t, 10*time.Second, func() error {
		if pids, err = g.Procs(); err != nil || len(pids) != 3 {
			return fmt.Errorf("want sh and two sleeps, have %v (%v)", pids, err)
		}
		return nil
	})
	return g, pids, exited
}

func TestKillReachesGrandchildrenAndDeleteRemoves(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, pids, exited := shAndTwoSleeps(t, m, "cell-03")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	<-exited
	for _, pid := range pids {
		if testutil.Alive(pid) {
			t.Errorf("pid %d survived the kill", pid)
		}
	}
	if names, _ := m.List(); len(names) != 0 {
		t.Errorf("groups left after Delete: %v", names)
	}
}

// A fork bomb inside a cell stops at the pids limit, and Kill still empties
// the cell (on v1 by forbidding forks first).
func TestForkBombStopsAtPIDsLimit(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, err := m.Ensure("cell-04", cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartIn(t, g, "/bin/sh", "-c", "while :; do sleep 1000 & done")
	testutil.Eventually(t, 30*time.Second, func() error {
		u, err := g.Usage()
		if err != nil {
			return err
		}
		if u.PIDsRefused == 0 {
			return errors.New("no fork refused yet; pids " + strconv.FormatUint(u.PIDs, 10))
		}
		return nil
	})
	u, err := g.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.PIDs > uint64(cellLimits.PIDs) || u.PIDsLimit != uint64(cellLimits.PIDs) {
		t.Fatalf("pids %d of limit %d: want at most %d", u.PIDs, u.PIDsLimit, cellLimits.PIDs)
	}
	t.Logf("fork bomb held at %d pids, %d forks refused", u.PIDs, u.PIDsRefused)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if pids, _ := g.Procs(); len(pids) != 0 {
		t.Fatalf("left after kill: %v", pids)
	}
	if l, _ := g.Limits(); l.PIDs != cellLimits.PIDs {
		t.Errorf("pids limit after kill = %d, want it restored to %d", l.PIDs, cellLimits.PIDs)
	}
}

// A memory hog inside a cell is OOM-killed there.
func TestMemoryHogOOMKilledInCell(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, err := m.Ensure("cell-05", cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	// tail buffers a line without a newline whole: it grows until killed.
	cmd, exited := testutil.StartIn(t, g, "/bin/sh", "-c", "head -c 2G /dev/zero | tail")
	<-exited
	u, uerr := g.Usage()
	if uerr != nil {
		t.Fatal(uerr)
	}
	if cmd.ProcessState.Success() {
		t.Fatal("the hog finished: it should have been OOM-killed")
	}
	if u.OOMKills == 0 {
		t.Fatalf("no OOM kill recorded in the cell (usage %+v); hog exit: %v", u, cmd.ProcessState)
	}
	if u.MemoryLimit != uint64(cellLimits.MemoryBytes) {
		t.Errorf("memory limit %d, want %d", u.MemoryLimit, cellLimits.MemoryBytes)
	}
	t.Logf("hog: %v; cell recorded %d OOM kill(s)", cmd.ProcessState, u.OOMKills)
}

// CPU usage is read on v2 and on hybrid hosts alike (cpuacct, with cpu or
// in a hierarchy of its own), grows under load and is what the kernel's file
// says; Paths names the group in every hierarchy the process is in.
func TestUsageCPUAndPathsPerController(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, err := m.Ensure("cell-05", cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	cmd, _ := testutil.StartIn(t, g, "/bin/sh", "-c", "while :; do :; done")
	testutil.Eventually(t, 20*time.Second, func() error {
		u, err := g.Usage()
		if err != nil {
			return err
		}
		if u.CPUUsageNS < uint64(50*time.Millisecond) {
			return errors.New("cpu usage " + strconv.FormatUint(u.CPUUsageNS, 10) + "ns")
		}
		return nil
	})
	raw := func() uint64 {
		t.Helper()
		var file string
		switch m.Mode() {
		case cgroup.ModeV2:
			kv := readStat(t, filepath.Join("/sys/fs/cgroup", g.Path(), "cpu.stat"))
			return kv["usage_usec"] * 1000
		default:
			file = filepath.Join("/sys/fs/cgroup", "cpuacct", g.Paths()["cpuacct"], "cpuacct.usage")
			if _, ok := g.Paths()["cpuacct"]; !ok { // cpuacct mounted with cpu
				file = filepath.Join("/sys/fs/cgroup", "cpu", g.Paths()["cpu"], "cpuacct.usage")
			}
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := raw()
	u, err := g.Usage()
	if err != nil {
		t.Fatal(err)
	}
	after := raw()
	if u.CPUUsageNS < before || u.CPUUsageNS > after {
		t.Errorf("usage %d ns, the kernel's file said %d then %d", u.CPUUsageNS, before, after)
	}

	own, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	paths := g.Paths()
	if len(paths) == 0 {
		t.Fatal("no paths")
	}
	for c, p := range paths {
		want := c
		if c == "unified" {
			want = ""
		}
		found := false
		for _, line := range strings.Split(string(own), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) == 3 && hasController(f[1], want) && f[2] == p {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: the process is not in %s:\n%s", c, p, own)
		}
	}
}

func readStat(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			out[f[0]], _ = strconv.ParseUint(f[1], 10, 64)
		}
	}
	return out
}
