package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"go.uber.org/zap"

	"cellvisor/cgroup"
)

// A restart on a cgroup v1 host costs a join: the helper that becomes the
// new master writes itself into four cgroup.procs files, and each v1
// migration queues behind the kernel's global cgroup_mutex and an RCU grace
// period of the threadgroup rwsem, which other cgroup work on the host
// holds for milliseconds to tens of milliseconds. So once a cell is ready
// (and every slot has had its first outcome, so that no start waits behind
// it), its slot keeps a spare: a standby helper, already joined to the
// cell's cgroups, blocked on a pipe from the agent. A restart releases it
// (one write: it execs the master in place), and a fresh spare is joined
// once the new master is ready.
//
// The spare runs inside the cell's limits from its first write on, and it
// only execs the slot's own master. It never outlives the slot's run: the
// slot's routine discards it (closes its pipe, SIGKILLs and reaps it) when
// the run ends (stop, unassignment, shutdown, leaving the cells to the
// next agent), and if the agent dies the pipe closes and the spare exits on
// its own. A next agent adopts the master by its record, pid file and start
// time; a spare of the previous agent, if it has not exited yet, is a
// leftover that a restart of the cell kills with the rest of the group.
// The spare is the agent's unreaped child until it is released or
// discarded, so its pid cannot be recycled: the leftover kill spares
// exactly it. It counts as one task against the cell's pids limit.
//
// spare is owned by the slot's routine, like unsaved.
type spare struct {
	cmd    *exec.Cmd
	sb     *cgroup.Standby
	limits cgroup.Limits // the group's limits when it joined
	ln     *listeners    // the slot's listeners it holds copies of
}

// makeSpare starts a spare for the slot's group, if the group is joined
// by a helper (v1) and the slot has none.
func (c *slot) makeSpare() {
	l := c.s.settings().Limits
	c.mu.Lock()
	g := c.group
	c.mu.Unlock()
	sg, ok := g.(cgroup.StandbyGroup)
	if !ok || c.spare != nil || c.ln == nil {
		// Without the slot's listeners (its master was adopted, and holds
		// the only copies) a spare would exec a master that binds the
		// ports itself; the next start binds them, and its spare follows.
		return
	}
	cmd, err := c.cellCmd()
	if err != nil {
		c.log.Warn("standby", zap.Error(err))
		return
	}
	sb, after, err := sg.PrepareStandby(cmd)
	if err != nil {
		closeOutput(cmd)
		c.log.Warn("standby", zap.Error(err))
		return
	}
	err = cmd.Start()
	after(err == nil)
	closeOutput(cmd)
	if err != nil {
		c.log.Warn("start standby", zap.Error(err))
		return
	}
	c.spare = &spare{cmd: cmd, sb: sb, limits: l, ln: c.ln}
	c.log.Debug("standby started", zap.Int("pid", cmd.Process.Pid))
}

// isSpare reports whether pid is the slot's spare.
func (c *slot) isSpare(pid int) bool {
	return c.spare != nil && c.spare.cmd.Process.Pid == pid
}

// killGroup kills every process of g but the slot's spare; with wait,
// until they are gone, else until none can run (cgroup.Condemn).
func (c *slot) killGroup(ctx context.Context, g cgroup.Group, wait bool) error {
	keep := 0
	if c.spare != nil {
		keep = c.spare.cmd.Process.Pid
	}
	if !wait {
		return cgroup.Condemn(ctx, g, keep)
	}
	if sg, ok := g.(cgroup.StandbyGroup); ok && keep != 0 {
		return sg.KillExcept(ctx, keep)
	}
	return g.Kill(ctx)
}

// releaseSpare execs the slot's master from its spare, if it has one, and
// returns the spare's command, which is now the master's. A spare that is
// gone is discarded with the error; the caller starts the cell itself.
func (c *slot) releaseSpare(g cgroup.Group) (*exec.Cmd, error) {
	sp := c.spare
	if sp == nil {
		return nil, nil
	}
	if _, ok := g.(cgroup.StandbyGroup); !ok {
		c.discardSpare()
		return nil, errors.New("the group takes no standby")
	}
	if sp.ln != c.ln {
		c.discardSpare()
		return nil, errors.New("the standby holds other listeners than the slot")
	}
	c.spare = nil
	// A spare that does not run (stopped by a signal, killed, or already a
	// zombie) would never exec the master: the cell would wait its whole
	// readiness timeout. Such a spare is discarded and the cell started by
	// a join.
	var f []string
	err := c.readAsCell(func() (err error) { f, err = procfs.Fields(sp.cmd.Process.Pid); return err })
	if dead := err == nil && killed(f); err != nil || !runnable(f[0]) || dead {
		state := "unreadable"
		if err == nil {
			state = f[0]
		}
		if dead {
			state += ", killed"
		}
		_ = sp.sb.Close()
		c.killReap(sp.cmd)
		return nil, fmt.Errorf("standby %d is not running (state %s)", sp.cmd.Process.Pid, state)
	}
	if err := sp.sb.Release(); err != nil {
		c.killReap(sp.cmd)
		return nil, err
	}
	return sp.cmd, nil
}

// runnable reports a process state (/proc/PID/stat field 3) in which a
// process can act on what it is sent: running or sleeping, not stopped,
// traced, dead or a zombie.
func runnable(state string) bool {
	switch state {
	case "R", "S", "D":
		return true
	}
	return false
}

// discardSpare ends the slot's spare, if it has one: its pipe closed, it
// is SIGKILLed (it may be stopped, or blocked in a join) and reaped.
func (c *slot) discardSpare() {
	sp := c.spare
	if sp == nil {
		return
	}
	c.spare = nil
	_ = sp.sb.Close()
	c.killReap(sp.cmd)
}

// killReap SIGKILLs a child of the agent (the slot's spare: the cell's
// user once joined) and reaps it, bounded: a process in uninterruptible
// sleep is left to be reaped in the background.
func (c *slot) killReap(cmd *exec.Cmd) {
	_ = c.asCell(func() error { return cmd.Process.Signal(syscall.SIGKILL) })
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
