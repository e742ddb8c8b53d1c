// Package celluser owns the users cells run as: one per slot, named
// cellvisor-cell-NN after the slot (made with their groups by the
// packages' sysusers.d, the agent's user a member of each group), whether
// this agent can run its cells as them, and the file operations the agent
// makes as a cell's user (with that user's filesystem ids). The agent
// (agent) resolves them at start; the supervisor starts cells as them and
// reads their /proc entries through Do; runtime gives each slot's
// directories to its group. Only agent and supervisor import it.
package celluser

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Prefix names a slot's user: Prefix + the slot's name ("cell-03").
const Prefix = "cellvisor-"

// Modes of the agent's cell_users setting.
const (
	// Auto runs cells as their slots' users where this agent can, and as
	// its own user, saying what isolation is missing, where it cannot.
	Auto = "auto"
	// Slot runs cells as their slots' users, or refuses to start.
	Slot = "slot"
	// Agent runs cells as the agent's own user.
	Agent = "agent"
)

// User is one slot's user.
type User struct {
	Name     string
	UID, GID uint32
}

// Name is the user of the slot named slot.
func Name(slot string) string { return Prefix + slot }

// Host is what Resolve asks of the host; Real is this process's.
type Host interface {
	// Lookup finds a user and its primary group by name.
	Lookup(name string) (*User, error)
	// CanSwitch reports why this process cannot switch users (nil when it
	// can: root, or CAP_SETUID and CAP_SETGID effective).
	CanSwitch() error
	// InGroup reports whether this process may give files to gid: root, or
	// a member of it.
	InGroup(gid uint32) bool
}

// ErrUnavailable wraps why slots' users cannot be had (mode slot).
var ErrUnavailable = errors.New("cells cannot run as their slots' users")

// Resolve returns each slot's user by slot name, or nil and why not
// ("" when mode is Agent, by choice): in mode Slot a reason is an error
// wrapping ErrUnavailable.
func Resolve(mode string, slots []string, h Host) (map[string]*User, string, error) {
	if mode == Agent {
		return nil, "", nil
	}
	why := func() string {
		if err := h.CanSwitch(); err != nil {
			return err.Error()
		}
		return ""
	}()
	users := map[string]*User{}
	for _, s := range slots {
		if why != "" {
			break
		}
		u, err := h.Lookup(Name(s))
		switch {
		case err != nil:
			why = fmt.Sprintf("no user %s (the package's sysusers.d makes %s01 to %s32): %v", Name(s), Prefix+"cell-", Prefix+"cell-", err)
		case u.UID == 0 || u.GID == 0:
			why = fmt.Sprintf("user %s is root or in root's group", u.Name)
		case !h.InGroup(u.GID):
			why = fmt.Sprintf("this agent is not a member of group %d of %s (the package makes it one; restart the agent after installing)", u.GID, u.Name)
		default:
			users[s] = u
		}
	}
	switch {
	case why == "":
		return users, "", nil
	case mode == Slot:
		return nil, why, fmt.Errorf("%w: %s", ErrUnavailable, why)
	}
	return nil, why, nil
}

// Reachable checks that a cell's user can reach its slot's directories
// under dirs (the state and run directories): every directory above each
// must be traversable by others (the agent makes dirs themselves so).
func Reachable(dirs ...string) error {
	for _, d := range dirs {
		d, err := filepath.Abs(d)
		if err != nil {
			return err
		}
		for p := filepath.Dir(d); ; p = filepath.Dir(p) {
			st, err := os.Stat(p)
			if err != nil {
				return fmt.Errorf("the cells' users cannot reach %s: %w", d, err)
			}
			if st.Mode().Perm()&0o001 == 0 {
				return fmt.Errorf("the cells' users cannot reach %s: %s is mode %04o, not traversable by others", d, p, st.Mode().Perm())
			}
			if p == "/" {
				break
			}
		}
	}
	return nil
}

// Real is Host of this process.
type Real struct{}

func (Real) Lookup(name string) (*User, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q", name, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q", name, u.Gid)
	}
	return &User{Name: name, UID: uint32(uid), GID: uint32(gid)}, nil
}

// Capabilities' bits in /proc/self/status's CapEff.
const (
	capSetgid = 6
	capSetuid = 7
)

func (Real) CanSwitch() error {
	if os.Geteuid() == 0 {
		return nil
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	eff, err := capEff(b)
	if err != nil {
		return err
	}
	if eff&(1<<capSetuid) == 0 || eff&(1<<capSetgid) == 0 {
		return errors.New("this agent is not root and lacks CAP_SETUID and CAP_SETGID")
	}
	return nil
}

// capEff is the CapEff mask of a /proc/PID/status.
func capEff(status []byte) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("/proc/self/status: no CapEff")
}

func (Real) InGroup(gid uint32) bool {
	if os.Geteuid() == 0 || uint32(os.Getegid()) == gid {
		return true
	}
	groups, err := os.Getgroups()
	return err == nil && slices.Contains(groups, int(gid))
}

// Do runs f on a thread of its own whose effective (and so filesystem)
// uid and gid are u's (nil u: f runs as it is): the kernel checks f's
// file operations, its signals and its reads of a process's /proc/PID/exe
// and fd entries as u's. That is how the agent signals its cells and
// reads their /proc entries and the files a cell made for itself (0700
// directories) without CAP_KILL, CAP_SYS_PTRACE or CAP_DAC_READ_SEARCH.
// The switch is the thread's alone (raw setresuid(2), not Go's, which
// switches every thread), and is undone before the thread runs anything
// else; a thread that cannot be switched back ends with f's goroutine.
func Do(u *User, f func() error) error {
	if u == nil {
		return f()
	}
	runtime.LockOSThread()
	egid, euid := unix.Getegid(), unix.Geteuid()
	if err := setres(unix.SYS_SETRESGID, int(u.GID)); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("act as %s: gid %d: %w", u.Name, u.GID, err)
	}
	if err := setres(unix.SYS_SETRESUID, int(u.UID)); err != nil {
		if setres(unix.SYS_SETRESGID, egid) == nil {
			runtime.UnlockOSThread()
		}
		return fmt.Errorf("act as %s: uid %d: %w", u.Name, u.UID, err)
	}
	defer func() {
		if setres(unix.SYS_SETRESUID, euid) == nil && setres(unix.SYS_SETRESGID, egid) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return f()
}

// setres sets this thread's effective id through trap (SYS_SETRESUID or
// SYS_SETRESGID), keeping its real and saved ones.
func setres(trap uintptr, id int) error {
	const keep = ^uintptr(0) // -1: unchanged
	if _, _, errno := unix.RawSyscall(trap, keep, uintptr(id), keep); errno != 0 {
		return errno
	}
	return nil
}
