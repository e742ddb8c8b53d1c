package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"cellvisor/cgexec"
)

// wrapExec rewrites cmd to start through the join helper (cgexec.Join), in
// a process group of its own, becoming the user of cmd's
// SysProcAttr.Credential (see takeCred) once joined.
func wrapExec(cmd *exec.Cmd, procsFiles []string) {
	cmd.Path, cmd.Args = cgexec.Join(takeCred(cmd), procsFiles, append([]string{cmd.Path}, cmd.Args[1:]...))
	ownGroup(cmd)
}

// takeCred takes the user cmd is to run as out of its
// SysProcAttr.Credential, for the helper to become (nil when none): os/exec
// would switch before the helper joins, when the cgroup files are still
// the agent's to write, and would leave the agent's ambient capabilities
// (CAP_SETUID among them) to the cell.
func takeCred(cmd *exec.Cmd) *cgexec.Cred {
	if cmd.SysProcAttr == nil || cmd.SysProcAttr.Credential == nil {
		return nil
	}
	c := cmd.SysProcAttr.Credential
	cmd.SysProcAttr.Credential = nil
	return &cgexec.Cred{UID: c.Uid, GID: c.Gid}
}

// wrapCred makes cmd, started where it needs no join (cloned into its
// cgroup, or unenforced), become its Credential's user through the helper.
func wrapCred(cmd *exec.Cmd) {
	if cmd.SysProcAttr != nil && cmd.SysProcAttr.Credential != nil {
		wrapExec(cmd, nil)
	}
}

// ownGroup makes cmd start in a process group of its own.
func ownGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

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
	_, err := s.w.WriteString(cgexec.ReleaseLine)
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

// wrapStandby rewrites cmd to run as a standby joining procsFiles
// (cgexec.Standby), waiting on the read end of a pipe passed after cmd's own
// extra files.
func wrapStandby(cmd *exec.Cmd, procsFiles []string) (*Standby, func(bool), error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("standby pipe: %w", err)
	}
	cmd.Path, cmd.Args = cgexec.Standby(takeCred(cmd), 3+len(cmd.ExtraFiles), procsFiles, append([]string{cmd.Path}, cmd.Args[1:]...))
	ownGroup(cmd)
	cmd.ExtraFiles = append(cmd.ExtraFiles, r)
	after := func(started bool) {
		r.Close() // the standby holds its own copy
		if !started {
			w.Close()
		}
	}
	return &Standby{w: w}, after, nil
}
