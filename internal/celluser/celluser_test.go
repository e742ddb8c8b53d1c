package celluser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/testkit/testutil"

	"golang.org/x/sys/unix"
)

type fakeHost struct {
	users     map[string]*User
	switchErr error
	groups    map[uint32]bool
}

func (h fakeHost) Lookup(name string) (*User, error) {
	if u, ok := h.users[name]; ok {
		return u, nil
	}
	return nil, fmt.Errorf("unknown user %s", name)
}
func (h fakeHost) CanSwitch() error        { return h.switchErr }
func (h fakeHost) InGroup(gid uint32) bool { return h.groups[gid] }

func TestResolve(t *testing.T) {
	slots := []string{"cell-01", "cell-02"}
	full := fakeHost{users: map[string]*User{
		"cellvisor-cell-01": {Name: "cellvisor-cell-01", UID: 901, GID: 901},
		"cellvisor-cell-02": {Name: "cellvisor-cell-02", UID: 902, GID: 902},
	}, groups: map[uint32]bool{901: true, 902: true}}
	missing := full
	missing.users = map[string]*User{"cellvisor-cell-01": full.users["cellvisor-cell-01"]}
	noCap := full
	noCap.switchErr = errors.New("lacks CAP_SETUID")
	notMember := full
	notMember.groups = map[uint32]bool{901: true}
	rootUser := full
	rootUser.users = map[string]*User{"cellvisor-cell-01": {Name: "cellvisor-cell-01", UID: 0, GID: 0}, "cellvisor-cell-02": full.users["cellvisor-cell-02"]}
	for _, tc := range []struct {
		name    string
		mode    string
		host    fakeHost
		users   int
		why     string // in the reason, "" for none
		refused bool
	}{
		{"auto with users", Auto, full, 2, "", false},
		{"slot with users", Slot, full, 2, "", false},
		{"agent by choice", Agent, full, 0, "", false},
		{"auto, a user missing", Auto, missing, 0, "no user cellvisor-cell-02", false},
		{"slot, a user missing", Slot, missing, 0, "no user cellvisor-cell-02", true},
		{"auto, no capability", Auto, noCap, 0, "lacks CAP_SETUID", false},
		{"slot, no capability", Slot, noCap, 0, "lacks CAP_SETUID", true},
		{"auto, not a member", Auto, notMember, 0, "not a member of group 902", false},
		{"slot, root user", Slot, rootUser, 0, "is root", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			users, why, err := Resolve(tc.mode, slots, tc.host)
			if (err != nil) != tc.refused || tc.refused && !errors.Is(err, ErrUnavailable) {
				t.Fatalf("err %v, want refused %v", err, tc.refused)
			}
			if len(users) != tc.users || (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
				t.Fatalf("users %v, why %q; want %d users, why %q", users, why, tc.users, tc.why)
			}
			if tc.users > 0 && users["cell-02"].UID != 902 {
				t.Errorf("cell-02's user %+v", users["cell-02"])
			}
		})
	}
}

func TestCapEff(t *testing.T) {
	eff, err := capEff([]byte("Name:\tx\nCapInh:\t0\nCapEff:\t00000000000004c0\n"))
	if err != nil || eff != 0x4c0 {
		t.Fatalf("%x, %v", eff, err)
	}
	if _, err := capEff([]byte("Name:\tx\n")); err == nil {
		t.Fatal("no CapEff: want an error")
	}
}

// Do reads a file only its user may read, as that user; the thread's own
// ids are back after.
func TestDoActsAsTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a file of another user's")
	}
	dir := t.TempDir()
	testutil.Traversable(t, dir)
	u := &User{Name: "x", UID: 64201, GID: 64201}
	own := filepath.Join(dir, "own")
	if err := os.Mkdir(own, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	// As the user: it may create in its own 0700 directory...
	if err := Do(u, func() error { return os.WriteFile(filepath.Join(own, "f"), []byte("x"), 0o600) }); err != nil {
		t.Fatalf("as the user, in its own directory: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(own, "f"), &st); err != nil || st.Uid != u.UID {
		t.Fatalf("the file made as the user: owner %d, %v; want %d", st.Uid, err, u.UID)
	}
	// ...and not in root's.
	if err := Do(u, func() error { return os.WriteFile(filepath.Join(dir, "g"), []byte("x"), 0o600) }); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("as the user, in root's 0755 directory: %v, want permission denied", err)
	}
	// Root again after.
	if err := os.WriteFile(filepath.Join(dir, "g"), []byte("x"), 0o600); err != nil {
		t.Fatalf("after Do: %v", err)
	}
}

// Do signals as the user: a process of that user, and not another's.
func TestDoSignalsAsTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a process as another user")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 64202, Gid: 64202}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	other, own := &User{Name: "a", UID: 64201, GID: 64201}, &User{Name: "b", UID: 64202, GID: 64202}
	pid := cmd.Process.Pid
	if err := Do(other, func() error { return unix.Kill(pid, 0) }); !errors.Is(err, unix.EPERM) {
		t.Fatalf("another user's signal: %v, want EPERM", err)
	}
	if err := Do(own, func() error { return unix.Kill(pid, syscall.SIGTERM) }); err != nil {
		t.Fatalf("its own user's signal: %v", err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("sleep exited 0, want killed by SIGTERM")
	}
	if euid := unix.Geteuid(); euid != 0 {
		t.Fatalf("euid %d after Do", euid)
	}
}

func TestReachable(t *testing.T) {
	dir := t.TempDir()
	testutil.Traversable(t, dir)
	state := filepath.Join(dir, "state")
	closed := filepath.Join(dir, "closed")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Reachable(state, filepath.Join(dir, "run")); err != nil {
		t.Errorf("under 0751 directories: %v", err)
	}
	if err := Reachable(state, filepath.Join(closed, "run")); err == nil || !strings.Contains(err.Error(), closed+" is mode 0700") {
		t.Errorf("under a 0700 directory: %v, want it named", err)
	}
}
