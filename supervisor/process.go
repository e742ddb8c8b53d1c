package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"cellvisor/cgroup"
	"cellvisor/internal/celluser"
	"cellvisor/internal/sysfile"
)

// ensureGroup creates (or updates) the slot's cgroup with its limits.
func (c *slot) ensureGroup() (cgroup.Group, error) {
	l := c.s.settings().Limits
	c.mu.Lock()
	g, fresh := c.group, c.fresh
	c.fresh = nil
	c.mu.Unlock()
	if g != nil && fresh != nil && *fresh == l {
		return g, nil // createGroups just wrote these limits
	}
	if g != nil && c.spare != nil && c.spare.limits == l {
		// The spare joined the group with these limits in place (Update
		// writes new ones to the group itself, and they then differ from
		// the spare's): nothing to create or write on the restart's path.
		return g, nil
	}
	g, err := c.s.o.Cgroups.Ensure(c.spec.Name, l)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.group = g
	c.mu.Unlock()
	return g, nil
}

// start launches the cell master inside its cgroup: by releasing the
// slot's standby when it has one (already joined: no cgroup migration on
// the restart's path), else through the group's own start. Its record is
// written by afterStart, once the readiness probe runs.
func (c *slot) start() (*proc, error) {
	t0 := time.Now()
	g, err := c.ensureGroup()
	if err != nil {
		return nil, err
	}
	condemned := c.condemned && c.ln != nil
	c.condemned = false
	if pids := c.leftovers(g, condemned || c.vacant); len(pids) > 0 {
		// Never start beside leftovers that still run. With the ports held
		// they need only be killed: the new master takes the held sockets
		// while the kernel tears the killed processes down. Without, an
		// orphaned worker would hold a port until it is gone.
		kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.killGroup(kctx, g, c.ln == nil)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	if err := c.holdListeners(); err != nil {
		return nil, err
	}
	// A killed master leaves its private socket behind, and nginx would fail
	// to bind it; nothing of the cell runs now, so it is stale.
	// (unlink(2) alone: os.Remove tries rmdir(2) too when unlink fails.)
	if err := unix.Unlink(c.spec.PrivateSocket()); err != nil && err != unix.ENOENT {
		return nil, fmt.Errorf("remove stale private socket %s: %w", c.spec.PrivateSocket(), err)
	}
	// So is its pid file, which a master of another user (cell_users
	// changed) left where this one may not replace it (a sticky directory).
	if err := unix.Unlink(c.spec.PidFile()); err != nil && err != unix.ENOENT {
		return nil, fmt.Errorf("remove stale pid file %s: %w", c.spec.PidFile(), err)
	}
	logs := markLogs(c.spec.LogsDir())
	cmd, err := c.releaseSpare(g)
	spared := cmd != nil
	if err != nil {
		c.log.Warn("standby unusable; starting the cell through a join", zap.Error(err))
	}
	if cmd == nil {
		if cmd, err = c.cellCmd(); err != nil {
			return nil, err
		}
		err = cgroup.Start(g, cmd)
		closeOutput(cmd)
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", c.s.o.Binary, err)
		}
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{}), started: c.s.clk.Now(), logs: logs, group: g}
	go func() {
		p.err = waitExit(cmd)
		close(p.done)
	}()
	c.mu.Lock()
	c.pid, c.answered = p.pid, false
	c.served, c.behind = 0, behindState{} // a new master: what it serves is asked once it answers
	c.mu.Unlock()
	c.startedBin()
	c.log.Debug("cell started", zap.Int("pid", p.pid), zap.Bool("standby", spared), zap.Duration("took", time.Since(t0)))
	return p, nil
}

// waitExit is cmd.Wait for a cell master, which runs for days: it waits
// for the exit on the runtime's poller, through a pidfd (readable once the
// process has exited), and only then reaps it with cmd.Wait, which returns
// at once. cmd.Wait alone blocks a thread in waitid(2) for the master's
// whole life: the runtime takes the thread's P back and starts or creates
// another thread for it, eight times during a cold start, while the cells
// compete for the CPU (docs/performance.md, round 13). Where a pidfd cannot
// be had or polled (a kernel before 5.10), it is cmd.Wait alone.
func waitExit(cmd *exec.Cmd) error {
	if f := pidfdFile(cmd.Process.Pid); f != nil {
		_ = awaitExit(f) // on an error cmd.Wait waits instead
		f.Close()
	}
	return cmd.Wait()
}

// pidfdFile is a non-blocking pidfd of the child pid, which the runtime's
// poller watches, or nil. The pid names the child until it is reaped, and
// only its waitExit reaps it.
func pidfdFile(pid int) *os.File {
	fd, err := pidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), "pidfd")
}

// pidfdOpen is pidfd_open(2) (a variable for tests of a kernel without
// it, or whose descriptor the poller refuses).
var pidfdOpen = unix.PidfdOpen

// awaitExit waits on the runtime's poller until the process of the
// non-blocking pidfd f has exited (the pidfd is readable: a zombie not yet
// reaped, or gone), and returns nil then; else the error that ended the
// wait: a read deadline in the past (a watch released), or a descriptor the
// poller cannot wait on.
func awaitExit(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		var gone bool
		gone, perr = exited(int(fd))
		return gone || perr != nil
	})
	if err == nil {
		err = perr
	}
	return err
}

// exited tells whether the process of pidfd fd has exited (the pidfd is
// readable), without waiting.
func exited(fd int) (bool, error) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents != 0, err
	}
}

// leftovers lists what of the cell runs in g but the slot's spare; nothing,
// without reading the group, when none can run there: the last exit's
// leftovers were just condemned, or the group is known vacant.
func (c *slot) leftovers(g cgroup.Group, noneCanRun bool) []int {
	if noneCanRun {
		return nil
	}
	pids, _ := g.Procs()
	return slices.DeleteFunc(pids, c.isSpare)
}

// cellCmd is the command of the slot's master, its output appended to the
// cell's stderr log (closeOutput closes the agent's copy once started).
func (c *slot) cellCmd() (*exec.Cmd, error) {
	stderr, err := openAppend(filepath.Join(c.spec.LogsDir(), "stderr.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(c.s.o.Binary,
		"-p", c.spec.Dir+"/",
		"-c", c.spec.ConfPath(),
		"-e", filepath.Join(c.spec.LogsDir(), "error.log"))
	cmd.Dir = c.spec.Dir
	if null := devNull(); null != nil {
		cmd.Stdin = null // else os/exec opens /dev/null for every start
	}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if u := c.user(); u != nil {
		// The cgroup's Prepare has the join helper become it (cgexec.Cred).
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, NoSetGroups: true}
	}
	if c.ln != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, c.ln.files...)
		cmd.Env = append(os.Environ(), c.ln.env())
	}
	return cmd, nil
}

// user is the slot's own user, or nil when the cells run as the agent's.
func (c *slot) user() *celluser.User { return c.s.o.Users[c.spec.Name] }

// openAppend opens a cell's log for appending, created if missing, with
// open(2) and an os.File around the descriptor (sysfile): os.OpenFile adds
// four system calls (the runtime's poller, offered a file it refuses) to
// every start.
func openAppend(path string) (*os.File, error) {
	fd, err := sysfile.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// devNull is the agent's one descriptor of /dev/null, every cell's stdin
// (nil, for os/exec's own, where it cannot be opened). It is never closed.
var devNull = sync.OnceValue(func() *os.File {
	fd, err := sysfile.Open(os.DevNull, unix.O_RDONLY, 0)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), os.DevNull)
})

// closeOutput closes the agent's copy of a started command's log file.
func closeOutput(cmd *exec.Cmd) {
	if f, ok := cmd.Stderr.(*os.File); ok {
		f.Close()
	}
}

// afterStart does the bookkeeping of a start that the new cell need not
// wait for, while its readiness probe already runs: the master's record
// (for adoption by a next agent). It is no longer written before the exec
// or the probe (with fsyncs it took from 2 ms to over 100 ms on a busy disk
// there), but still before the cell is marked ready (supervise calls this
// first), so an agent that reports a cell ready has its record.
func (c *slot) afterStart(p *proc) {
	if !p.adopted {
		c.writeRecord(p.pid, p.group, p.done)
	}
}

// saveUnsaved persists a restart count not yet persisted. The slot's
// routine calls it once the restarted cell's probe has an outcome, before
// the cell is marked ready: the write's two fsyncs no longer share the
// host with the new master's start.
func (c *slot) saveUnsaved() {
	if c.unsaved {
		c.unsaved = false
		c.saveCounters()
	}
}

// stop stops a cell in stages: SIGQUIT (graceful: in-flight requests finish),
// wait up to grace, SIGKILL the process group, then kill whatever is left in
// the cgroup and wait for the master to be reaped.
func (c *slot) stop(p *proc, grace time.Duration) {
	// Workers stop accepting on SIGQUIT; with the agent's copy of the
	// listeners open, new connections would wait for a master that is
	// not coming.
	c.dropListeners()
	_ = c.asCell(func() error { return p.signal(syscall.SIGQUIT) })
	t := c.s.clk.NewTimer(grace)
	select {
	case <-p.done:
		t.Stop()
	case <-t.C():
		c.log.Warn("cell did not stop in time; killing it", zap.Duration("grace", grace))
		if p.adopted {
			_ = c.asCell(func() error { return p.signal(syscall.SIGKILL) }) // its group is killed below, by cgroup
		} else {
			_ = c.asCell(func() error { return syscall.Kill(-p.pid, syscall.SIGKILL) })
		}
	}
	c.killLeftovers(true)
	<-p.done // the master is dead or was SIGKILLed: Wait returns, or its pidfd is readable
	c.removeRecord()
	c.mu.Lock()
	c.pid, c.served, c.behind = 0, 0, behindState{}
	c.mu.Unlock()
}

// afterExit records an exit (unexpected, or forced with the reason why) and
// kills whatever the master left behind (an orphaned worker keeps the port
// otherwise).
func (c *slot) afterExit(p *proc, forced string) {
	t0 := time.Now()
	c.killLeftovers(c.ln == nil)
	c.condemned = c.ln != nil
	c.log.Debug("cell leftovers killed", zap.Duration("took", time.Since(t0)), zap.Bool("waited", c.ln == nil))
	c.removeRecord()
	why := describeExit(p.err)
	if forced != "" {
		why = forced
	} else if detail := exitDetail(c.spec.LogsDir(), p.logs, p.pid); detail != "" {
		why += ": " + detail
	}
	c.mu.Lock()
	c.pid, c.served, c.behind = 0, 0, behindState{}
	c.lastExit = "exited: " + why
	c.mu.Unlock()
	c.log.Warn("cell exited", zap.String("why", why), zap.Int("pid", p.pid))
}

// killLeftovers kills what is left in the slot's group; with wait, until
// the group is empty (see cgroup.KillExcept).
func (c *slot) killLeftovers(wait bool) {
	c.mu.Lock()
	g := c.group
	c.mu.Unlock()
	if g == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.killGroup(ctx, g, wait); err != nil {
		c.log.Error("kill cell leftovers", zap.Error(err))
	}
}

// reopenLogs asks the running cell to reopen its log files (SIGUSR1).
func (c *slot) reopenLogs() error {
	pid, _ := c.running()
	if pid == 0 {
		return nil
	}
	return c.asCell(func() error { return syscall.Kill(pid, syscall.SIGUSR1) })
}

// asCell sends one signal to the cell: as the agent, else, refused (the
// cell runs as its own user and the agent is not root), as the cell's
// user (celluser.Do).
func (c *slot) asCell(send func() error) error {
	err := send()
	if u := c.user(); u != nil && errors.Is(err, syscall.EPERM) {
		err = celluser.Do(u, send)
	}
	return err
}

// readAsCell reads what /proc says of one of the cell's processes: as the
// agent, else as the cell's user. Under the packaged unit's
// ProtectProc=invisible another user's processes are not there for the
// agent at all; a process just started may still be the join helper,
// the agent's, or already the cell's user's.
func (c *slot) readAsCell(read func() error) error {
	err := read()
	if u := c.user(); u != nil && err != nil {
		err = celluser.Do(u, read)
	}
	return err
}

// removeGroup deletes the slot's cgroup after its cell stopped.
func (c *slot) removeGroup() error {
	c.mu.Lock()
	g := c.group
	c.group = nil
	c.mu.Unlock()
	if g == nil || g.Path() == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Delete(ctx); err != nil {
		return fmt.Errorf("remove cgroup of %s: %w", c.spec.Name, err)
	}
	return nil
}

func describeExit(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by signal " + ws.Signal().String()
		}
		return fmt.Sprintf("exit status %d", ee.ExitCode())
	}
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
