// Package procstat reads /proc/PID/stat: the fields after the process's
// command name, which is in parentheses and may itself hold spaces and
// parentheses; and from /proc/PID/status a process's uid and pending
// SIGKILL. A Reader reads the tree under its Root (a fixture's in tests);
// the package's functions read /proc. Any package may import it.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"cellvisor/internal/sysfile"
)

// DefaultRoot is where the system's /proc is.
const DefaultRoot = "/proc"

// Reader reads a /proc tree. The zero Reader reads /proc.
type Reader struct {
	// Root is the tree's directory, or "" for DefaultRoot.
	Root string
}

// Path is the path of name in the tree ("net/tcp", "self/status").
func (r Reader) Path(name string) string {
	root := r.Root
	if root == "" {
		root = DefaultRoot
	}
	return root + "/" + name
}

// PIDPath is the path of a process's file in the tree: PIDPath(42, "stat")
// is /proc/42/stat, and PIDPath(42, "") its directory, /proc/42.
func (r Reader) PIDPath(pid int, name string) string {
	p := r.Path(strconv.Itoa(pid))
	if name != "" {
		p += "/" + name
	}
	return p
}

// minFields is the fields Fields promises: through rss (field 24).
const minFields = 24 - 2

// Fields returns the fields of /proc/pid/stat after the command name, as
// proc(5) numbers them less 3: f[0] is the state (field 3), f[2] the
// process group (5), f[11] and f[12] utime and stime (14, 15), f[19] the
// start time (22), f[20] and f[21] vsize and rss (23, 24).
func Fields(pid int) ([]string, error) { return Reader{}.Fields(pid) }

// Fields is Fields of the process pid in r's tree.
func (r Reader) Fields(pid int) ([]string, error) {
	path := r.PIDPath(pid, "stat")
	b, err := sysfile.ReadFile(path, 4096)
	if err != nil {
		return nil, err
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Parse splits the content of a stat file as Fields does.
func Parse(b []byte) ([]string, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed: no command name")
	}
	var f []string
	for _, w := range bytes.Fields(b[i+1:]) {
		f = append(f, string(w))
	}
	if len(f) < minFields {
		return nil, fmt.Errorf("malformed: %d fields", len(f))
	}
	return f, nil
}

// Dead reports a state field (f[0]) of a process that is gone but for its
// entry: a zombie, or dead.
func Dead(state string) bool { return state == "Z" || state == "X" }

// Exiting reports stat fields (Fields) of a process on its way out: the
// kernel's PF_EXITING in its flags (field 9, f[6]), set once it has begun
// to exit and before it is a zombie. A process killed a moment ago is one.
func Exiting(f []string) bool {
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}

// pfExiting is PF_EXITING (include/linux/sched.h).
const pfExiting = 0x4

// KillPending reports whether pid has a SIGKILL pending, sent to it or to
// its thread group and not yet acted on (/proc/PID/status, SigPnd and
// ShdPnd): it is about to exit.
func KillPending(pid int) (bool, error) { return Reader{}.KillPending(pid) }

// KillPending is KillPending of the process pid in r's tree.
func (r Reader) KillPending(pid int) (bool, error) {
	path := r.PIDPath(pid, "status")
	b, err := sysfile.ReadFile(path, 64<<10)
	if err != nil {
		return false, err
	}
	dying, err := killPendingIn(b)
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	return dying, nil
}

// UID is a live process's real uid (/proc/PID/status's Uid line).
func UID(pid int) (int, error) { return Reader{}.UID(pid) }

// UID is UID of the process pid in r's tree.
func (r Reader) UID(pid int) (int, error) {
	path := r.PIDPath(pid, "status")
	b, err := sysfile.ReadFile(path, 64<<10)
	if err != nil {
		return 0, err
	}
	uid, err := uidIn(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return uid, nil
}

// uidIn is the real uid of a status file's content.
func uidIn(status []byte) (int, error) {
	for _, line := range bytes.Split(status, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Uid:")); ok {
			if f := bytes.Fields(v); len(f) > 0 {
				return strconv.Atoi(string(f[0]))
			}
		}
	}
	return 0, errors.New("no Uid line")
}

// killPendingIn is KillPending of a status file's content.
func killPendingIn(status []byte) (bool, error) {
	const sigkill = 1 << (9 - 1)
	for _, line := range bytes.Split(status, []byte("\n")) {
		name, mask, ok := bytes.Cut(line, []byte(":"))
		if !ok || (string(name) != "SigPnd" && string(name) != "ShdPnd") {
			continue
		}
		v, err := strconv.ParseUint(string(bytes.TrimSpace(mask)), 16, 64)
		if err != nil {
			return false, fmt.Errorf("%s: %w", name, err)
		}
		if v&sigkill != 0 {
			return true, nil
		}
	}
	return false, nil
}
