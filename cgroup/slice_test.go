package cgroup

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCommonAncestor(t *testing.T) {
	for _, tc := range []struct{ a, b, want string }{
		{"/cellvisor.slice/cellvisor.service", "/cellvisor.slice/cellvisor-cells.scope", "/cellvisor.slice"},
		{"/system.slice/cellvisor.service", "/system.slice/cellvisor-cells.scope", "/system.slice"},
		{"/a.slice/x.service", "/b.slice/y.scope", "/"},
		{"/a/b", "/a/b/c", "/a/b"},
		{"/a/bc", "/a/b", "/a"},
		{"/", "/x", "/"},
	} {
		if got := commonAncestor(tc.a, tc.b); got != tc.want {
			t.Errorf("commonAncestor(%q, %q) = %q, want %q", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestWritableByMe(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "cgroup.procs")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode uint32
		uid  int
		want bool
	}{
		{0o644, os.Geteuid(), true},
		{0o444, os.Geteuid(), false},
		{0o644, os.Geteuid() + 12345, false},
		{0o646, os.Geteuid() + 12345, true},
	} {
		if err := os.Chmod(f, os.FileMode(tc.mode)); err != nil {
			t.Fatal(err)
		}
		if tc.uid != os.Geteuid() {
			if os.Geteuid() != 0 {
				continue // only root can give a file away
			}
			if err := os.Chown(f, tc.uid, tc.uid); err != nil {
				t.Fatal(err)
			}
		}
		got, err := writableBy(f, myIDs())
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("mode %o owner %d: writable %v, want %v", tc.mode, tc.uid, got, tc.want)
		}
	}
}

// The common-ancestor rule refuses, naming why, an agent that may not
// write the cgroup.procs its unit and the cells' scope meet at, and takes
// one that may.
func TestAncestorRule(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the file away")
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "cellvisor.slice"), 0o755); err != nil {
		t.Fatal(err)
	}
	procs := filepath.Join(root, "cellvisor.slice", "cgroup.procs")
	if err := os.WriteFile(procs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	own, cells := "/cellvisor.slice/cellvisor.service", "/cellvisor.slice/cellvisor-cells.scope"
	if err := ancestorRule(root, own, cells, ids{}); err != nil {
		t.Errorf("root passes the kernel's check, and so this one: %v", err)
	}
	agent := ids{uid: nobody, gid: nobody}
	err := ancestorRule(root, own, cells, agent)
	if err == nil || !strings.Contains(err.Error(), "common ancestor /cellvisor.slice's cgroup.procs is not writable by uid 65534") {
		t.Errorf("a cgroup.procs not the agent's: %v, want the refusal naming the rule", err)
	}
	if err := os.Chown(procs, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if err := ancestorRule(root, own, cells, agent); err != nil {
		t.Errorf("a cgroup.procs handed to the agent: %v", err)
	}
}

// sliceForTest makes a slice-like cgroup on a cgroup2 mount (a hybrid
// host's unified one will do: handing files over needs no controllers)
// holding unit.service/.control and cells.scope, and returns the mount and
// the slice's path below it.
func sliceForTest(t *testing.T) (root, slice string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups and hand them over")
	}
	root = cgroup2Mount(t)
	b := make([]byte, 4)
	rand.Read(b)
	slice = "/cvtest-" + hex.EncodeToString(b) + ".slice"
	for _, d := range []string{"unit.service/.control", "cells.scope"} {
		if err := os.MkdirAll(filepath.Join(root, slice, d), 0o755); err != nil {
			t.Skipf("cannot create cgroups under %s: %v", root, err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{"unit.service/.control", "unit.service", "cells.scope", "other.service", ""} {
			syscall.Rmdir(filepath.Join(root, slice, d))
		}
	})
	return root, slice
}

// The privileged step hands the slice's cgroup.procs, and nothing else of
// it, to the agent's user where the slice holds only the unit and the
// cells' scope; it refuses a slice shared with other units, and tells a
// scope left in another slice apart.
func TestHandOverSlice(t *testing.T) {
	root, slice := sliceForTest(t)
	o := PrepareOptions{Root: root, UID: nobody, GID: nobody, ProcSelfCgroup: []byte("0::" + slice + "/unit.service/.control\n")}

	got, err := HandOverSlice(o, slice+"/cells.scope")
	if err != nil {
		t.Fatal(err)
	}
	procs := filepath.Join(root, slice, "cgroup.procs")
	if got != procs {
		t.Errorf("handed %q, want %q", got, procs)
	}
	owner := func(p string) uint32 {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid
	}
	if owner(procs) != nobody {
		t.Errorf("%s owned by %d, want %d", procs, owner(procs), nobody)
	}
	for _, p := range []string{filepath.Join(root, slice), filepath.Join(root, slice, "cgroup.subtree_control")} {
		if owner(p) != 0 {
			t.Errorf("%s handed over too (owner %d)", p, owner(p))
		}
	}
	os.Lchown(procs, 0, 0)

	if _, err := HandOverSlice(o, "/elsewhere.slice/cells.scope"); !errors.Is(err, ErrScopeElsewhere) {
		t.Errorf("a scope in another slice: %v, want ErrScopeElsewhere", err)
	}

	if err := os.Mkdir(filepath.Join(root, slice, "other.service"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = HandOverSlice(o, slice+"/cells.scope")
	if err == nil || !strings.Contains(err.Error(), "other.service") {
		t.Errorf("a slice shared with other.service: %v, want a refusal naming it", err)
	}
	if owner(procs) != 0 {
		t.Errorf("a refused slice's cgroup.procs was handed over")
	}
}
