package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// execArg0 is argv[0] of the exec helper.
const execArg0 = "cellvisor-cgexec"

// ExecInit must run first in main, and in TestMain of any package whose tests
// start cells on a v1 host. When this process was started as the exec helper
// (argv: cellvisor-cgexec <cgroup.procs>... -- <binary> <args>...), it writes
// its own pid into each cgroup.procs file and then execs the binary, so the
// cell is inside its cgroups before its first instruction. It does not return
// in that case.
func ExecInit() {
	if len(os.Args) == 0 || os.Args[0] != execArg0 {
		return
	}
	args := os.Args[1:]
	sep := -1
	for i, a := range args {
		if a == "--" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+1 >= len(args) {
		fmt.Fprintln(os.Stderr, "cellvisor-cgexec: usage: cellvisor-cgexec PROCS... -- BINARY ARGS...")
		os.Exit(126)
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	for _, f := range args[:sep] {
		if err := os.WriteFile(f, pid, 0); err != nil {
			fmt.Fprintf(os.Stderr, "cellvisor-cgexec: join cgroup: %v\n", err)
			os.Exit(126)
		}
	}
	bin := args[sep+1]
	err := syscall.Exec(bin, args[sep+1:], os.Environ())
	fmt.Fprintf(os.Stderr, "cellvisor-cgexec: exec %s: %v\n", bin, err)
	os.Exit(127)
}

// wrapExec rewrites cmd to run through the exec helper (this binary).
func wrapExec(cmd *exec.Cmd, procsFiles []string) {
	args := append([]string{execArg0}, procsFiles...)
	args = append(args, "--", cmd.Path)
	args = append(args, cmd.Args[1:]...)
	cmd.Path = "/proc/self/exe"
	cmd.Args = args
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}
