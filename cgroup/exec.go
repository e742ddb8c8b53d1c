package cgroup

import (
	"os/exec"
	"syscall"
)

// joinShell is the v1 exec helper: a POSIX shell that writes its own pid
// into each cgroup.procs file named before "--" and then execs the cell in
// place (same pid), so the cell is inside its cgroups before its first
// instruction. Paths and arguments arrive as positional parameters, never in
// the script text. A shell is used rather than a re-exec of the agent because
// it starts in about a millisecond: re-running the agent's binary (with its
// package initialisers) cost ~25ms per cell start on a slow-exec VM.
const joinShell = "/bin/sh"

// joinScript exits 126 if a cgroup cannot be joined, naming it on stderr
// (the shell prints "cellvisor-cgexec: 1: cannot create …").
const joinScript = `while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"`

// execArg0 names the helper in the cell's stderr log.
const execArg0 = "cellvisor-cgexec"

// wrapExec rewrites cmd to run through the join helper.
func wrapExec(cmd *exec.Cmd, procsFiles []string) {
	args := []string{joinShell, "-c", joinScript, execArg0}
	args = append(args, procsFiles...)
	args = append(args, "--", cmd.Path)
	args = append(args, cmd.Args[1:]...)
	cmd.Path = joinShell
	cmd.Args = args
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}
