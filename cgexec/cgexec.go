// Package cgexec owns the cgroup v1 join helper: the command through which
// the agent starts a cell inside its v1 groups before the cell's first
// instruction. v1 has no clone-into-cgroup, so the cell is exec'd by a
// helper process that first moves itself into each group (by writing "0",
// its own thread, to the group's tasks file) and then execs the cell in
// place (same pid).
//
// The helper is built into the binary that links this package: on
// linux/amd64 a binary linked with LDFlags starts at entry, a few
// instructions that, when argv[0] names the helper, join and exec with raw
// system calls before Go's runtime exists, and otherwise jump to Go's own
// entry point. Exec'd through /proc/self/exe it costs about what exec of a
// static C program costs. A binary without it (another architecture, a
// build without LDFlags, a test binary) uses the same helper written as a
// /bin/sh script, which costs half a millisecond to a millisecond more CPU
// per cell (the shell's dynamic loading and start).
//
// The helper also switches the cell to a user of its own (Cred) once it
// has joined: the join needs the agent's user, which owns the cgroup
// files; the cell must not keep it, nor the capabilities that let the agent
// switch users.
//
// The package links nothing but the standard library and internal/sysfile:
// the benchmark's floor (testkit/floorspawn) starts its cells through it
// as the agent does. cgroup, supervisor, agent and testkit/floorspawn
// import it.
package cgexec

import (
	"encoding/binary"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"cellvisor/internal/sysfile"
)

// Names of the helper, as argv[0]: they select the helper's mode in a
// binary that carries it, and name the helper in the cell's stderr log and
// in ps.
const (
	// JoinName joins and execs at once.
	JoinName = "cellvisor-cgexec"
	// StandbyName joins, then waits for "exec" on a pipe.
	StandbyName = "cellvisor-standby"
)

// EntrySymbol is the linker symbol of the helper's entry point.
const EntrySymbol = "cellvisor/cgexec.entry"

// selfExe is the running binary, whatever its path is now (an upgrade may
// have replaced or removed the file since the agent started).
const selfExe = "/proc/self/exe"

// joinShell runs the helper where the binary does not carry it.
const joinShell = "/bin/sh"

// joinScript is the helper as a shell script. It writes "0" (the writing
// thread) to each tasks file, not its pid to cgroup.procs: the shell has one
// thread, so both move the whole process, but a v1 kernel write-locks the
// global threadgroup rwsem (which waits for an RCU grace period, ~1.3 ms
// here, holding cgroup_mutex all the while) for a write naming a pid or a
// process, and skips it for the writer's own thread. Eight cells joining
// four hierarchies each at a cold start queued ~43 ms behind that lock; the
// four self-moves of one cell take ~0.1 ms (measured, kernel 6.18). It exits
// 126 if a group cannot be joined (the shell prints "cellvisor-cgexec: 1:
// cannot create …"). Paths and arguments arrive as positional parameters,
// never in the script text.
const joinScript = joinLoop + `exec ` + becomeScript + `"$@"`

// joinLoop is both scripts' join: a user to become ("+UID:GID", optional),
// every tasks file up to "--", then a program to exec.
const joinLoop = `c=; case "$1" in +*) c=${1#+}; shift;; esac; ` +
	`while [ "$1" != -- ]; do echo 0 > "$1" || exit 126; shift; done; shift; [ $# -gt 0 ] || { echo "$0: no program" >&2; exit 126; }; ` +
	`[ -z "$c" ] || umask 007; `

// becomeScript precedes the program in the scripts' exec: with a user to
// become, setpriv (util-linux) switches to it (no supplementary groups) and
// drops CAP_SETUID and CAP_SETGID from the inherited and ambient sets, as
// the built-in helper does.
const becomeScript = `${c:+setpriv --reuid=${c%:*} --regid=${c#*:} --clear-groups --inh-caps=-setuid,-setgid --ambient-caps=-setuid,-setgid --} `

// standbyScript joins like joinScript, then blocks reading fd @FD@. The line
// "exec" makes it exec the cell, already inside its groups, with that fd
// closed; anything else or end of file (the agent closed the pipe, or
// exited) makes it exit 0 without starting anything, so a standby never
// outlives its agent.
const standbyScript = joinLoop + `read -r go <&@FD@ || exit 0; [ "$go" = exec ] || exit 0; exec ` + becomeScript + `"$@" @FD@<&-`

// LDFlags returns the linker flags that make a binary for this platform
// carry the helper, or "" where it has none. Only binaries that link this
// package may use them: the linker refuses an entry symbol it does not have.
func LDFlags() string {
	if !supported {
		return ""
	}
	return "-E " + EntrySymbol
}

// Builtin reports whether the running binary carries the helper: whether its
// process entry point (the kernel's AT_ENTRY) is entry.
var Builtin = sync.OnceValue(func() bool {
	if !supported {
		return false
	}
	at, err := auxEntry()
	return err == nil && at == entryPC()
})

// auxEntry reads AT_ENTRY from the process's auxiliary vector.
func auxEntry() (uintptr, error) {
	data, err := sysfile.ReadFile("/proc/self/auxv", 4096)
	if err != nil {
		return 0, err
	}
	const atEntry = 9
	word := strconv.IntSize / 8
	for len(data) >= 2*word {
		key, val := readWord(data), readWord(data[word:])
		if key == atEntry {
			return val, nil
		}
		data = data[2*word:]
	}
	return 0, syscall.ENOENT
}

func readWord(b []byte) uintptr {
	if strconv.IntSize == 64 {
		return uintptr(binary.NativeEndian.Uint64(b))
	}
	return uintptr(binary.NativeEndian.Uint32(b))
}

// Cred is a user a cell runs as: the helper switches to it after joining,
// with no supplementary groups, a umask of 007 (the cell's files readable
// and writable by its group, which the agent is a member of), and without
// CAP_SETUID and CAP_SETGID in its inheritable and ambient capabilities, so
// that the program it execs holds neither (it keeps the others the agent
// passes on, CAP_NET_BIND_SERVICE). A nil Cred keeps the caller's user.
type Cred struct {
	UID, GID uint32
}

// Valid reports whether the helper can switch to c: neither id is -1
// ("unchanged" to setresuid) or root's.
func (c *Cred) Valid() bool {
	return c == nil || c.UID != 0 && c.GID != 0 && c.UID != ^uint32(0) && c.GID != ^uint32(0)
}

func (c *Cred) arg() []string {
	if c == nil {
		return nil
	}
	return []string{"+" + strconv.FormatUint(uint64(c.UID), 10) + ":" + strconv.FormatUint(uint64(c.GID), 10)}
}

// Join returns the program and argv of a command that joins each of tasks
// (a v1 hierarchy's tasks file, or a v2 cgroup.procs) and then execs argv
// (argv[0] the program's path, not searched in PATH) in place, with the
// same environment, as the user as (nil: the caller's; see Cred). It exits
// 126 if a group cannot be joined, the user cannot be become, or the
// program cannot be exec'd (127 when the program does not exist), with a
// line on stderr that begins with JoinName.
func Join(as *Cred, tasks, argv []string) (path string, args []string) {
	return joinCommand(Builtin(), selfExe, as, tasks, argv)
}

// joinCommand is Join through exe's built-in helper, or through the shell.
func joinCommand(builtin bool, exe string, as *Cred, tasks, argv []string) (string, []string) {
	if builtin {
		return exe, helperArgs(append([]string{JoinName}, as.arg()...), tasks, argv)
	}
	return joinShell, helperArgs(append([]string{joinShell, "-c", joinScript, JoinName}, as.arg()...), tasks, argv)
}

// Standby returns the program and argv of a standby: it joins like Join,
// then blocks reading fd (a pipe from the caller, inherited as that fd). The
// line "exec" (ReleaseLine) makes it exec argv in place with fd closed, as
// the user as; anything else, or end of file, makes it exit 0 having
// started nothing. The built-in helper becomes the user before it waits,
// the shell's at the exec.
func Standby(as *Cred, fd int, tasks, argv []string) (path string, args []string) {
	return standbyCommand(Builtin(), selfExe, as, fd, tasks, argv)
}

// standbyCommand is Standby through exe's built-in helper, or through the
// shell.
func standbyCommand(builtin bool, exe string, as *Cred, fd int, tasks, argv []string) (string, []string) {
	if builtin {
		return exe, helperArgs(append([]string{StandbyName, strconv.Itoa(fd)}, as.arg()...), tasks, argv)
	}
	script := strings.ReplaceAll(standbyScript, "@FD@", strconv.Itoa(fd))
	return joinShell, helperArgs(append([]string{joinShell, "-c", script, StandbyName}, as.arg()...), tasks, argv)
}

// ReleaseLine is what a standby's pipe must carry for it to exec.
const ReleaseLine = "exec\n"

func helperArgs(head, tasks, argv []string) []string {
	args := make([]string, 0, len(head)+len(tasks)+1+len(argv))
	args = append(append(args, head...), tasks...)
	return append(append(args, "--"), argv...)
}

// Explain rewrites the built-in helper's failure line ("cellvisor-cgexec:
// cannot join PATH: errno 13") with the errno's text ("…: permission
// denied"). Any other line is returned as it is.
func Explain(line string) string {
	if !strings.HasPrefix(line, JoinName+": ") {
		return line
	}
	i := strings.LastIndex(line, ": errno ")
	if i < 0 {
		return line
	}
	head, num := line[:i], line[i+len(": errno "):]
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return line
	}
	return head + ": " + syscall.Errno(n).Error()
}
