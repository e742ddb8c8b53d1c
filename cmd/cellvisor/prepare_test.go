package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/cgroup"
)

func TestLookupUser(t *testing.T) {
	for _, name := range []string{"root", "0"} {
		uid, gid, err := lookupUser(name)
		if err != nil || uid != 0 || gid != 0 {
			t.Errorf("lookupUser(%q) = %d, %d, %v; want 0, 0", name, uid, gid, err)
		}
	}
	if _, _, err := lookupUser("no-such-user-cellvisor-test"); err == nil {
		t.Error("lookupUser of an unknown user: want an error")
	}
}

// The privileged pre-start step creates the cells' scope with a holder
// running as the agent's user and hands the scope's cgroups to that user
// (the directories and cgroup.procs/tasks, never a limit file), so that an
// unprivileged agent can create its cells there; run again, it finds the
// same scope and creates no other.
func TestPrepareScopeHandsScopeToAgentUser(t *testing.T) {
	f := newScopeFixture(t)
	const nobody = 65534
	o := cgroup.PrepareOptions{UID: nobody, GID: nobody}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", strings.TrimPrefix(f.env[0], "DBUS_SYSTEM_BUS_ADDRESS="))
	dirs, err := ensureScope(ctx, o, []string{"/bin/sleep", "infinity"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("nothing handed over")
	}
	files := []string{"", "cgroup.procs"}
	for _, d := range dirs {
		if !strings.HasSuffix(d, f.scopeCG) {
			t.Errorf("handed over %s, not the scope %s", d, f.scopeCG)
		}
		for _, name := range files {
			if uid := fileOwner(t, filepath.Join(d, name)); uid != nobody {
				t.Errorf("%s/%s owned by %d, want %d", d, name, uid, nobody)
			}
		}
	}
	for _, lim := range []string{"memory/memory.limit_in_bytes", "pids/pids.max", "cpu/cpu.cfs_quota_us", "memory.max", "pids.max"} {
		p := filepath.Join("/sys/fs/cgroup", filepath.Dir(lim), f.scopeCG, filepath.Base(lim))
		if _, err := os.Stat(p); err == nil {
			if uid := fileOwner(t, p); uid != 0 {
				t.Errorf("the scope's own limit %s was handed over (owner %d)", p, uid)
			}
		}
	}
	holders := f.holders()
	if len(holders) != 1 {
		t.Fatalf("holders %v, want one", holders)
	}
	if uid := fileOwner(t, filepath.Join("/proc", strconv.Itoa(holders[0]))); uid != nobody {
		t.Errorf("holder runs as %d, want %d (the agent must be able to end it)", uid, nobody)
	}
	if setpriv, err := exec.LookPath("setpriv"); err == nil {
		probe := filepath.Join(dirs[0], "cell-99")
		out, err := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "mkdir", probe).CombinedOutput()
		if err != nil {
			t.Errorf("the agent's user cannot create a cell cgroup in the scope: %v %s", err, out)
		}
		_ = os.Remove(probe)
	}
	again, err := ensureScope(ctx, o, []string{"/bin/sleep", "infinity"})
	if err != nil || !slices.Equal(again, dirs) {
		t.Errorf("second run: %v, %v; want %v", again, err, dirs)
	}
	if n := countCalls(f.sd.Calls(), "StartTransientUnit"); n != 1 {
		t.Errorf("StartTransientUnit called %d times, want once", n)
	}
	if got := f.holders(); !slices.Equal(got, holders) {
		t.Errorf("holders %v after the second run, want %v", got, holders)
	}
}

func fileOwner(t *testing.T, p string) int {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return int(st.Uid)
}
