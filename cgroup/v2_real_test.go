package cgroup

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// unifiedForTest returns a v2 manager on a cgroup2 mount even where that
// mount has no controllers (a hybrid host's /sys/fs/cgroup/unified): clone
// into a cgroup, procs and cgroup.kill need none, so the v2 start and kill
// paths run for real here. Limits are not exercised (they need controllers).
func unifiedForTest(t *testing.T) *v2 {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	root := cgroup2Mount(t)
	if _, err := os.Stat(root + "/cgroup.kill"); err != nil {
		if _, err := os.Stat(root + "/cgroup.procs"); err != nil {
			t.Skipf("cgroup2 mount unusable: %v", err)
		}
	}
	self, err := readSelf(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	m := &v2{root: root, base: self[""] + "/cvtest-v2-" + hex.EncodeToString(b)}
	if err := os.MkdirAll(m.dir(""), 0o755); err != nil {
		t.Skipf("cannot create a cgroup under %s: %v", m.dir(""), err)
	}
	t.Cleanup(func() { os.Remove(m.dir("")) })
	return m
}

// A cell starts inside its group both ways: cloned into it, and (where
// clone3 is refused: systemd's RestrictNamespaces=) through the join helper,
// which writes "0" to the group's cgroup.procs before it execs the cell.
// cgroup2Mount is this host's cgroup2 mount (a hybrid host's unified one
// will do where controllers are not needed), or skips the test.
func cgroup2Mount(t *testing.T) string {
	t.Helper()
	for _, r := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(r, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return r
		}
	}
	t.Skip("no cgroup2 mount on this host")
	return ""
}

func TestV2CloneIntoCgroupAndKill(t *testing.T) {
	for _, join := range []bool{false, true} {
		t.Run(map[bool]string{false: "clone3", true: "join helper"}[join], func(t *testing.T) {
			m := unifiedForTest(t)
			m.join = join
			testV2StartAndKill(t, m)
		})
	}
}

func testV2StartAndKill(t *testing.T, m *v2) {
	if err := os.Mkdir(m.dir("cell-01"), 0o755); err != nil {
		t.Fatal(err)
	}
	g, err := m.Open("cell-01")
	if err != nil {
		t.Fatal(err)
	}
	// The program itself reads its cgroup: it was born inside it.
	cmd := exec.Command("/bin/sh", "-c", "cat /proc/self/cgroup; sleep 1000 & sleep 1000 & wait")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := Start(g, cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	var pids []int
	for {
		pids, _ = g.Procs()
		if len(pids) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("procs %v, want sh and two sleeps", pids)
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if !strings.Contains(out.String(), "0::"+g.Path()+"\n") {
		t.Errorf("child's /proc/self/cgroup:\n%s\nwant 0::%s", out.String(), g.Path())
	}
	for _, pid := range pids {
		if live(pid) {
			t.Errorf("pid %d survived cgroup.kill", pid)
		}
	}
	if _, err := os.Stat(m.dir("cell-01")); !os.IsNotExist(err) {
		t.Errorf("group not removed: %v", err)
	}
}

// Cgroups someone else made inside a cell's group (an operator's mkdir, a
// process moved into one) neither keep the group from being removed nor
// survive its kill.
func TestV2KillPrunesForeignChildren(t *testing.T) {
	m := unifiedForTest(t)
	for _, d := range []string{"cell-01/x", "cell-01/y/z"} {
		if err := os.MkdirAll(m.dir(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	g, err := m.Open("cell-01")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	if err := os.WriteFile(m.dir("cell-01/y/z/cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Delete(ctx); err != nil {
		t.Fatalf("delete with foreign children: %v", err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the process in a child cgroup survived the cell's kill")
	}
	if _, err := os.Stat(m.dir("cell-01")); !os.IsNotExist(err) {
		t.Errorf("group not removed: %v", err)
	}
}

// live reports a running (not zombie) process; testutil.Alive cannot be
// imported from inside this package.
func live(pid int) bool {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(st, ')')
	return i >= 0 && i+2 < len(st) && st[i+2] != 'Z' && st[i+2] != 'X'
}

// A group ensureAt could not give its limits (here: a mount without the
// controllers) is removed when ensureAt made it, and left as it was when it
// was there already: an update that fails never takes a cell's group away.
func TestV2FailedEnsureRemovesOnlyAGroupItMade(t *testing.T) {
	m := unifiedForTest(t)
	if err := m.ensureAt(m.base, "cell-01", Limits{MemoryBytes: 1 << 29, CPUQuotaUS: 50000, CPUPeriodUS: 100000, PIDs: 128}); err == nil {
		t.Skip("this cgroup2 mount has the controllers: nothing fails here")
	}
	if _, err := os.Stat(m.dir("cell-01")); !os.IsNotExist(err) {
		t.Errorf("a group it made and could not limit is still there (%v)", err)
	}
	if err := os.Mkdir(m.dir("cell-02"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(m.dir("cell-02")) })
	if err := m.ensureAt(m.base, "cell-02", Limits{MemoryBytes: 1 << 29, CPUQuotaUS: 50000, CPUPeriodUS: 100000, PIDs: 128}); err == nil {
		t.Fatal("the update succeeded where the new group's limits failed")
	}
	if _, err := os.Stat(m.dir("cell-02")); err != nil {
		t.Errorf("a failed update removed the existing group: %v", err)
	}
}
