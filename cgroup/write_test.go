package cgroup

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

var testLimits = Limits{MemoryBytes: 512 << 20, CPUQuotaUS: 50000, CPUPeriodUS: 100000, PIDs: 128, CPUBurstUS: 50000}

func TestV1SettingsOrderAndValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limits
		want []setting
	}{
		{"cell", testLimits, []setting{
			{"memory", "memory.limit_in_bytes", "536870912"},
			{"cpu", "cpu.cfs_period_us", "100000"},
			{"cpu", "cpu.cfs_quota_us", "50000"},
			{"pids", "pids.max", "128"},
		}},
		// The agent's leaf before its quota: no quota (-1 as is), no
		// PIDs limit ("max").
		{"no quota, no pids", Limits{MemoryBytes: 1 << 30, CPUQuotaUS: -1, CPUPeriodUS: 100000}, []setting{
			{"memory", "memory.limit_in_bytes", "1073741824"},
			{"cpu", "cpu.cfs_period_us", "100000"},
			{"cpu", "cpu.cfs_quota_us", "-1"},
			{"pids", "pids.max", "max"},
		}},
		{"negative pids", Limits{MemoryBytes: -1, CPUQuotaUS: 1000, CPUPeriodUS: 1000, PIDs: -1}, []setting{
			{"memory", "memory.limit_in_bytes", "-1"},
			{"cpu", "cpu.cfs_period_us", "1000"},
			{"cpu", "cpu.cfs_quota_us", "1000"},
			{"pids", "pids.max", "max"},
		}},
	} {
		if got := v1Settings(tc.l); !slices.Equal(got, tc.want) {
			t.Errorf("%s: v1Settings = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestV2SettingsAndCPUMax(t *testing.T) {
	for _, tc := range []struct {
		quota  int64
		period uint64
		want   string
	}{{50000, 100000, "50000 100000"}, {-1, 100000, "max 100000"}, {-5, 50000, "max 50000"}, {0, 100000, "0 100000"}} {
		if got := cpuMax(tc.quota, tc.period); got != tc.want {
			t.Errorf("cpuMax(%d, %d) = %q, want %q", tc.quota, tc.period, got, tc.want)
		}
	}
	for _, tc := range []struct {
		pids int64
		want []setting
	}{
		{128, []setting{{"", "cpu.max", "50000 100000"}, {"", "memory.max", "536870912"}, {"", "pids.max", "128"}}},
		{0, []setting{{"", "cpu.max", "50000 100000"}, {"", "memory.max", "536870912"}, {"", "pids.max", "max"}}},
		{-1, []setting{{"", "cpu.max", "50000 100000"}, {"", "memory.max", "536870912"}, {"", "pids.max", "max"}}},
	} {
		l := testLimits
		l.PIDs = tc.pids
		if got := v2Settings(l); !slices.Equal(got, tc.want) {
			t.Errorf("PIDs %d: v2Settings = %v, want %v", tc.pids, got, tc.want)
		}
	}
}

func TestSubtreeControlFiles(t *testing.T) {
	for _, tc := range []struct {
		root, dir string
		want      []string
	}{
		{"/sys/fs/cgroup", "/sys/fs/cgroup/system.slice/cv.service/cell-01", []string{
			"/sys/fs/cgroup/cgroup.subtree_control",
			"/sys/fs/cgroup/system.slice/cgroup.subtree_control",
			"/sys/fs/cgroup/system.slice/cv.service/cgroup.subtree_control",
		}},
		{"/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified/cell-01", []string{
			"/sys/fs/cgroup/unified/cgroup.subtree_control",
		}},
		{"/sys/fs/cgroup", "/sys/fs/cgroup", nil},
	} {
		if got := subtreeControlFiles(tc.root, tc.dir); !slices.Equal(got, tc.want) {
			t.Errorf("subtreeControlFiles(%q, %q) = %q, want %q", tc.root, tc.dir, got, tc.want)
		}
	}
}

func TestCheckGroupPath(t *testing.T) {
	for g, ok := range map[string]bool{"/a/cell-01": true, "/": true, "a/cell-01": false, "/a//cell-01": false, "/a/../b": false, "/sys/fs/cgroup/a": false} {
		if err := checkGroupPath(g); (err == nil) != ok {
			t.Errorf("checkGroupPath(%q) = %v", g, err)
		}
	}
}

// On a plain directory standing in for the v1 mounts, ensureAt creates the
// group in each hierarchy, at each one's base, and writes its files; an
// update to no PIDs limit lifts the old one.
func TestV1EnsureAtWritesEachHierarchy(t *testing.T) {
	root := t.TempDir()
	m := &v1{root: root, base: map[string]string{"memory": "/m", "cpu": "/c", "pids": "/p"}, ctrls: v1Controllers}
	if err := m.ensureAt(m.base, "cell-01", testLimits); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{
		"memory/m/cell-01/memory.limit_in_bytes": "536870912",
		"cpu/c/cell-01/cpu.cfs_period_us":        "100000",
		"cpu/c/cell-01/cpu.cfs_quota_us":         "50000",
		"pids/p/cell-01/pids.max":                "128",
	} {
		if got := readTrim(t, filepath.Join(root, f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "cpu/c/cell-01/cpu.cfs_burst_us")); !os.IsNotExist(err) {
		t.Errorf("cpu.cfs_burst_us written where the kernel has none: %v", err)
	}
	l := testLimits
	l.PIDs, l.CPUQuotaUS = 0, -1
	if err := m.ensureAt(m.base, "cell-01", l); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(root, "pids/p/cell-01/pids.max")); got != "max" {
		t.Errorf("pids.max = %q after an update to no PIDs limit, want max", got)
	}
	if got := readTrim(t, filepath.Join(root, "cpu/c/cell-01/cpu.cfs_quota_us")); got != "-1" {
		t.Errorf("cpu.cfs_quota_us = %q, want -1", got)
	}
	// A failed write is the error, with the group named.
	if err := os.Remove(filepath.Join(root, "cpu/c/cell-01/cpu.cfs_quota_us")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "cpu/c/cell-01/cpu.cfs_quota_us"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := m.ensureAt(m.base, "cell-01", testLimits)
	if err == nil || !strings.Contains(err.Error(), "create v1 cgroup cell-01") {
		t.Errorf("ensureAt with an unwritable quota = %v, want a create v1 cgroup cell-01 error", err)
	}
}

// On a plain directory standing in for the v2 mount, ensureAt enables the
// controllers in every ancestor from the mount down to the parent, and
// only the parent's failure counts; a failure removes the group again.
func TestV2EnsureAtEnablesAncestorsAndWritesLimits(t *testing.T) {
	root := t.TempDir()
	m := &v2{root: root}
	if err := m.ensureAt("/svc/sub", "cell-01", testLimits); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"", "svc", "svc/sub"} {
		if got := readTrim(t, filepath.Join(root, d, "cgroup.subtree_control")); got != "+cpu +memory +pids" {
			t.Errorf("%s/cgroup.subtree_control = %q", d, got)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "svc/sub/cell-01/cgroup.subtree_control")); !os.IsNotExist(err) {
		t.Errorf("the group's own cgroup.subtree_control written: %v", err)
	}
	for f, want := range map[string]string{"cpu.max": "50000 100000", "memory.max": "536870912", "pids.max": "128"} {
		if got := readTrim(t, filepath.Join(root, "svc/sub/cell-01", f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}

	// An ancestor above the parent that refuses is no error.
	block := func(f string) {
		t.Helper()
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(f, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	block(filepath.Join(root, "svc/cgroup.subtree_control"))
	if err := m.ensureAt("/svc/sub", "cell-02", testLimits); err != nil {
		t.Fatalf("a grandparent refusing controllers: %v", err)
	}
	// The parent's refusal is, and the new group goes again.
	block(filepath.Join(root, "svc/sub/cgroup.subtree_control"))
	err := m.ensureAt("/svc/sub", "cell-03", testLimits)
	if err == nil || !strings.Contains(err.Error(), "create v2 cgroup cell-03") || !strings.Contains(err.Error(), "svc/sub/cgroup.subtree_control") {
		t.Errorf("the parent refusing controllers: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "svc/sub/cell-03")); !os.IsNotExist(err) {
		t.Errorf("group left behind after a failed create: %v", err)
	}
}

// The fallback for kernels without cgroup.kill, on the real cgroup2 mount:
// it reaches processes in groups below the group too, and leaves the
// group thawed.
func TestV2FreezeKillReachesSubgroups(t *testing.T) {
	m := unifiedForTest(t)
	for _, d := range []string{"cell-01", "cell-01/sub"} {
		if err := os.Mkdir(m.dir(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		os.Remove(m.dir("cell-01/sub"))
		os.Remove(m.dir("cell-01"))
	})
	var cmds []*exec.Cmd
	for _, name := range []string{"cell-01", "cell-01/sub"} {
		cmd := exec.Command("/bin/sleep", "1000")
		if err := Start(&v2Group{m: m, name: name}, cmd); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	})
	pids, err := treeProcs(m.dir("cell-01"))
	if err != nil || len(pids) != 2 {
		t.Fatalf("treeProcs = %v, %v; want both sleeps", pids, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := freezeKill(ctx, m.dir("cell-01"), func(pids []int) { m.killPIDs("cell-01", pids) }); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case err := <-done:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
				t.Errorf("sleep %d: %v, want killed by a signal", c.Process.Pid, err)
			}
		case <-ctx.Done():
			t.Fatalf("sleep %d survived freezeKill", c.Process.Pid)
		}
	}
	cmds = nil
	if got := readTrim(t, m.dir("cell-01/cgroup.freeze")); got != "0" {
		t.Errorf("cgroup.freeze = %q after freezeKill, want 0 (thawed)", got)
	}
	if _, err := treeProcs(m.dir("cell-02")); !os.IsNotExist(err) {
		t.Errorf("treeProcs of a missing group = %v, want ENOENT", err)
	}
}
