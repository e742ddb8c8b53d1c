package sdscope_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/internal/fakesystemd"
	"cellvisor/sdscope"
)

func TestScopeName(t *testing.T) {
	for _, tc := range []struct{ unit, want string }{
		{"cellvisor.service", "cellvisor-cells.scope"},
		{"cellvisor@edge1.service", "cellvisor@edge1-cells.scope"},
		{"noext", "noext-cells.scope"},
	} {
		if got := sdscope.ScopeName(tc.unit); got != tc.want {
			t.Errorf("ScopeName(%q) = %q, want %q", tc.unit, got, tc.want)
		}
	}
}

func TestKeepsCells(t *testing.T) {
	for job, want := range map[string]bool{
		"stop": false, "": false, "start": false, "reload": false, "verify-active": false,
		"reload-or-start": false, "restart": true, "try-restart": true,
	} {
		if got := sdscope.KeepsCells(job); got != want {
			t.Errorf("KeepsCells(%q) = %v, want %v", job, got, want)
		}
	}
}

// fixture starts a private bus with the fake systemd on it, for a unit in
// a slice of the test's own on the real cgroup hierarchies.
func fixture(t *testing.T) (*fakesystemd.Systemd, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the fake systemd creates cgroups")
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil {
			t.Skip("needs a cgroup hierarchy")
		}
	}
	addr := fakesystemd.StartBus(t)
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", addr)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	slice := "cvtest" + hex.EncodeToString(b) + ".slice"
	sd := fakesystemd.Start(t, fakesystemd.Options{Address: addr, Unit: "cvtest.service", Slice: slice})
	return sd, slice
}

func dial(t *testing.T) *sdscope.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdscope.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// The first caller creates the scope around a holder in a leaf of its own;
// the next finds it by name at the same cgroup; the unit's job reads back;
// Release kills the holder (found by its leaf), removes the leaf and stops
// the scope.
func TestCreateFindRelease(t *testing.T) {
	sd, slice := fixture(t)
	c := dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	unit, err := c.OwnUnit(ctx)
	if err != nil || unit != "cvtest.service" {
		t.Fatalf("OwnUnit = %q, %v", unit, err)
	}
	name := sdscope.ScopeName(unit)
	if _, err := c.Find(ctx, name); !errors.Is(err, sdscope.ErrNotFound) {
		t.Fatalf("Find before Create: %v, want ErrNotFound", err)
	}
	// The unit's UMask=0027 applies to its privileged pre-start step,
	// which creates the scope: the holder's leaf must stay readable by the
	// agent, which finds the holder there when it ends the scope.
	old := syscall.Umask(0o027)
	s, err := c.Create(ctx, sdscope.CreateOptions{Name: name, Unit: unit, Holder: []string{"/bin/sleep", "infinity"}, UID: -1, GID: -1})
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range sdscope.Dirs("/sys/fs/cgroup", s.ControlGroup) {
		if fi, err := os.Stat(filepath.Join(d, sdscope.HolderLeaf)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("holder leaf in %s: %v, mode %v; want 0755 whatever the umask", d, err, fi.Mode().Perm())
		}
	}
	if want := "/" + slice + "/" + name; s.ControlGroup != want {
		t.Errorf("ControlGroup = %q, want %q", s.ControlGroup, want)
	}
	holders := sdscope.Holders("/sys/fs/cgroup", s.ControlGroup)
	if len(holders) != 1 {
		t.Fatalf("holders in the leaf: %v, want one", holders)
	}
	comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(holders[0]), "comm"))
	if strings.TrimSpace(string(comm)) != "sleep" {
		t.Errorf("holder %d is %q, want sleep", holders[0], comm)
	}
	for _, d := range sdscope.Dirs("/sys/fs/cgroup", s.ControlGroup) {
		if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err != nil || len(strings.TrimSpace(string(b))) != 0 {
			t.Errorf("%s holds %q (%v): the holder belongs in its leaf", d, b, err)
		}
	}

	again := dial(t)
	found, err := again.Find(ctx, name)
	if err != nil || found != s {
		t.Fatalf("Find = %+v, %v, want %+v", found, err, s)
	}
	if _, err := again.Create(ctx, sdscope.CreateOptions{Name: name, Unit: unit, Holder: []string{"/bin/sleep", "infinity"}, UID: -1, GID: -1}); err == nil {
		t.Error("a second Create of a running scope succeeded")
	}
	if got := sdscope.Holders("/sys/fs/cgroup", s.ControlGroup); len(got) != 1 {
		t.Errorf("after a refused Create the leaf holds %v, want the one holder", got)
	}

	for _, job := range []string{"", "restart", "stop"} {
		sd.SetJob(unit, job)
		got, err := again.UnitJob(ctx, unit)
		if err != nil || got != job {
			t.Errorf("UnitJob with %q set = %q, %v", job, got, err)
		}
	}

	if err := again.Release(ctx, "", s); err != nil {
		t.Fatal(err)
	}
	if err := syscallKill0(holders[0]); err == nil {
		t.Errorf("holder %d still runs after Release", holders[0])
	}
	if _, active := sd.Scope(name); active {
		t.Error("scope still active after Release")
	}
	for _, d := range sdscope.Dirs("/sys/fs/cgroup", s.ControlGroup) {
		t.Errorf("scope directory %s left after Release", d)
	}
}

// A bus that is not there fails within the caller's bound.
func TestDialUnreachable(t *testing.T) {
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+filepath.Join(t.TempDir(), "nobus"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := sdscope.Dial(ctx); err == nil {
		c.Close()
		t.Fatal("Dial to a missing bus succeeded")
	}
}
