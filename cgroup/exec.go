package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// joinShell is the v1 exec helper: a POSIX shell that moves itself into
// each cgroup named before "--" (by its tasks file) and then execs the cell
// in place (same pid), so the cell is inside its cgroups before its first
// instruction. Paths and arguments arrive as positional parameters, never in
// the script text. A shell is used rather than a re-exec of the agent because
// it starts in about a millisecond: re-running the agent's binary (with its
// package initialisers) cost ~25ms per cell start on a slow-exec VM.
const joinShell = "/bin/sh"

// joinScript exits 126 if a cgroup cannot be joined, naming it on stderr
// (the shell prints "cellvisor-cgexec: 1: cannot create …").
//
// It writes "0" (the writing thread itself) to each hierarchy's tasks file,
// not its pid to cgroup.procs: the shell has one thread, so both move the
// whole process, but a v1 kernel write-locks the global threadgroup rwsem
// (which waits for an RCU grace period, ~1.3 ms here, holding cgroup_mutex
// all the while) for a write naming a pid or a process, and skips it for
// the writer's own thread. Eight cells joining four hierarchies each at a
// cold start queued ~43 ms behind that lock; the four self-moves of one
// cell take ~0.1 ms (measured, kernel 6.18).
const joinScript = `while [ "$1" != -- ]; do echo 0 > "$1" || exit 126; shift; done; shift; exec "$@"`

// execArg0 names the helper in the cell's stderr log.
const execArg0 = "cellvisor-cgexec"

// JoinArgv is the command line of the v1 join helper that joins each of
// tasks (a hierarchy's tasks file) and then execs argv in place: how the
// agent starts a cell on v1 (wrapExec), and how the whole-process
// benchmark's floor starts one the same way.
func JoinArgv(tasks, argv []string) []string {
	args := []string{joinShell, "-c", joinScript, execArg0}
	args = append(args, tasks...)
	return append(append(args, "--"), argv...)
}

// wrapExec rewrites cmd to run through the join helper.
func wrapExec(cmd *exec.Cmd, procsFiles []string) {
	cmd.Args = JoinArgv(procsFiles, append([]string{cmd.Path}, cmd.Args[1:]...))
	cmd.Path = joinShell
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// standbyScript is the join helper of a standby: it joins like joinScript,
// then blocks reading fd @FD@ (a pipe from the agent, after the cell's own
// extra files; standbyScriptFor fills the number in). The line "exec" makes it exec
// the cell at once, already inside its cgroups, with that fd closed; end of
// file (the agent closed the pipe, or exited) makes it exit 0 without
// starting anything, so a standby never outlives its agent.
const standbyScript = `while [ "$1" != -- ]; do echo 0 > "$1" || exit 126; shift; done; shift; read -r go <&@FD@ || exit 0; [ "$go" = exec ] || exit 0; exec "$@" @FD@<&-`

// standbyScriptFor is standbyScript reading fd: a number the agent chose,
// never anything of the cell's.
func standbyScriptFor(fd int) string {
	return strings.ReplaceAll(standbyScript, "@FD@", strconv.Itoa(fd))
}

// standbyArg0 names a standby in the cell's stderr log and in ps.
const standbyArg0 = "cellvisor-standby"

// StandbyGroup is a group whose cells are started through a join (cgroup
// v1): there a standby, joined ahead of time, takes the join off a
// restart's path. On cgroup v2 a cell is cloned straight into its cgroup,
// with nothing to take off; v2 and unenforced groups do not implement it.
type StandbyGroup interface {
	Group
	// PrepareStandby makes cmd start as a standby of the group: it joins
	// the group, then waits until Release execs cmd's program in place
	// (same pid), or exits 0 once the returned Standby is closed. Call
	// after, when not nil, once cmd.Start has returned.
	PrepareStandby(cmd *exec.Cmd) (sb *Standby, after func(started bool), err error)
	// KillExcept is Kill sparing keep, a standby of the group: the caller's
	// own child, not yet reaped, so its pid cannot name another process.
	KillExcept(ctx context.Context, keep int) error
}

// Standby is the agent's end of a standby's pipe.
type Standby struct {
	w *os.File
}

// Release tells the standby to exec its program now. It fails when the
// standby is gone (EPIPE); the caller then starts the cell the usual way.
func (s *Standby) Release() error {
	_, err := s.w.WriteString("exec\n")
	if cerr := s.w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("release standby: %w", err)
	}
	return nil
}

// Close ends the standby without starting anything: it reads end of file
// and exits. Closing a released standby is a no-op.
func (s *Standby) Close() error {
	if err := s.w.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}

// wrapStandby rewrites cmd to run as a standby joining procsFiles, waiting
// on the read end of a pipe passed after cmd's own extra files.
func wrapStandby(cmd *exec.Cmd, procsFiles []string) (*Standby, func(bool), error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("standby pipe: %w", err)
	}
	wrapExec(cmd, procsFiles)
	cmd.Args[2], cmd.Args[3] = standbyScriptFor(3+len(cmd.ExtraFiles)), standbyArg0
	cmd.ExtraFiles = append(cmd.ExtraFiles, r)
	after := func(started bool) {
		r.Close() // the standby holds its own copy
		if !started {
			w.Close()
		}
	}
	return &Standby{w: w}, after, nil
}
