package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"cellvisor/internal/procstat"
	"cellvisor/internal/sysfile"
)

// nginx's own binary upgrade, for a master adopted from a previous agent.
// Its parent is no longer the process that started it, so nginx takes
// USR2: it renames its pid file to nginx.pid.oldbin and forks and execs
// the binary at its path (the new file) as a new master, which inherits
// every listening socket (public ports and private socket) and writes the
// pid file. Old and new workers then accept side by side: nothing is
// refused, and if the new master does not come up the old one simply goes
// on (the new one is stopped). Once a worker of the new master runs its
// event loop, the old master is told to QUIT: its workers finish what they
// serve (long streams included) while the new ones take every new
// connection. The slot then watches the new master, as adopted (it is the
// old master's child, reparented once that exits).

// usr2Taken bounds the wait for a master to take USR2.
const usr2Taken = 2 * time.Second

// errNoUSR2 says the master did not start a new binary on USR2.
var errNoUSR2 = errors.New("the master started no new binary on USR2")

// binaryUpgrade moves the adopted master old onto the binary at its path
// with USR2; it returns the new master, watched, or why not, with old
// left serving.
func (c *slot) binaryUpgrade(ctx context.Context, old *proc) (*proc, error) {
	ctx, cancel := context.WithTimeout(ctx, c.s.o.ReadyTimeout)
	defer cancel()
	if err := c.asCell(func() error { return old.signal(syscall.SIGUSR2) }); err != nil {
		return nil, fmt.Errorf("USR2 to %d: %w", old.pid, err)
	}
	npid, err := c.awaitNewMaster(ctx, old)
	if err != nil {
		return nil, err
	}
	fd, err := unix.PidfdOpen(npid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd of the new master %d: %w", npid, err)
	}
	np, err := watchPidfd(npid, fd)
	if err != nil {
		return nil, err
	}
	np.started = c.s.clk.Now()
	np.logs = markLogs(c.spec.LogsDir())
	if err := c.awaitWorker(ctx, np); err != nil {
		c.log.Warn("new binary's master not ready; stopping it, the old one goes on", zap.Int("new", npid), zap.Error(err))
		c.stopNew(np)
		return nil, err
	}
	// The new master serves: the old one finishes what it serves and goes.
	if err := c.asCell(func() error { return old.signal(syscall.SIGQUIT) }); err != nil {
		c.log.Warn("QUIT the old master", zap.Int("pid", old.pid), zap.Error(err))
	}
	old.release()
	c.mu.Lock()
	c.pid, c.served = npid, 0 // the new master read the switched release; asked at the next check
	g := c.group
	c.mu.Unlock()
	c.startedBin()
	if g != nil {
		c.writeRecord(npid, g, np.done)
	}
	c.log.Info("cell runs the new binary (nginx binary upgrade)", zap.Int("pid", npid), zap.Int("was", old.pid))
	return np, nil
}

// awaitNewMaster waits until the pid file names a new master, a child of
// old in the cell's cgroup, with the old master's pid in nginx.pid.oldbin.
// It fails as soon as the old master gave up (the new binary exited: the
// .oldbin file is renamed back).
func (c *slot) awaitNewMaster(ctx context.Context, old *proc) (int, error) {
	pidFile := c.spec.PidFile()
	sawOldbin := false
	// nginx renames its pid file at once when it takes USR2.
	ignoredBy := c.s.clk.Now().Add(usr2Taken)
	for {
		if !sawOldbin && c.s.clk.Now().After(ignoredBy) {
			// Ignored, or the new binary came and went between two looks.
			return 0, fmt.Errorf("%w: no %s.oldbin after %s (see the cell's error.log)", errNoUSR2, pidFile, usr2Taken)
		}
		oldbin, errOld := readPid(ctx, pidFile+".oldbin")
		cur, errCur := readPid(ctx, pidFile)
		switch {
		case errOld == nil && oldbin == old.pid:
			sawOldbin = true
			if errCur == nil && cur != old.pid && c.isChildIn(cur, old.pid) {
				return cur, nil
			}
		case sawOldbin && errCur == nil && cur == old.pid:
			return 0, fmt.Errorf("%w: the new binary exited (see the cell's error.log)", errNoUSR2)
		}
		if err := c.tick(ctx, old); err != nil {
			return 0, fmt.Errorf("%w: the new master wrote no pid file: %w", errNoUSR2, err)
		}
	}
}

// tick waits a poll interval; an error when ctx ended or old exited.
func (c *slot) tick(ctx context.Context, old *proc) error {
	t := c.s.clk.NewTimer(10 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-old.done:
		return errors.New("the old master exited")
	case <-t.C():
		return nil
	}
}

// isChildIn reports whether pid is a live child of parent in the slot's
// cgroup.
func (c *slot) isChildIn(pid, parent int) bool {
	var f []string
	if err := c.readAsCell(func() (err error) { f, err = liveStat(pid); return err }); err != nil {
		return false
	}
	if ppid, err := strconv.Atoi(f[1]); err != nil || ppid != parent {
		return false
	}
	c.mu.Lock()
	g := c.group
	c.mu.Unlock()
	if g == nil {
		return false
	}
	members, err := g.Procs()
	return err == nil && slices.Contains(members, pid)
}

// awaitWorker waits until a worker process of the master np runs its event
// loop (waits in epoll: its configuration and init_worker are done).
func (c *slot) awaitWorker(ctx context.Context, np *proc) error {
	for {
		if c.workerServing(np.pid) {
			return nil
		}
		if err := c.tick(ctx, np); err != nil {
			return fmt.Errorf("no worker of the new master %d in its event loop: %w", np.pid, err)
		}
	}
}

// workerServing reports whether a child of pid is an nginx worker waiting
// in epoll.
func (c *slot) workerServing(pid int) bool {
	serving := false
	_ = c.readAsCell(func() error {
		kids, err := children(pid)
		if err != nil {
			return err
		}
		for _, k := range kids {
			dir := procfs.PIDPath(k.pid, "")
			title, err := sysfile.ReadFile(dir+"/cmdline", 4096)
			if err != nil || !strings.Contains(string(title), "worker process") {
				continue
			}
			if f, err := procfs.Fields(k.pid); err != nil || procstat.Exiting(f) {
				continue
			}
			wchan, err := os.ReadFile(dir + "/wchan")
			if err == nil && strings.Contains(string(wchan), "epoll") {
				serving = true
				return nil
			}
		}
		return nil
	})
	return serving
}

// stopNew stops a new master that did not come up: QUIT, then KILL after
// the stop timeout; the old master renames its .oldbin file back.
func (c *slot) stopNew(np *proc) {
	_ = c.asCell(func() error { return np.signal(syscall.SIGQUIT) })
	t := c.s.clk.NewTimer(c.s.o.StopTimeout)
	defer t.Stop()
	select {
	case <-np.done:
		return
	case <-t.C():
	}
	_ = c.asCell(func() error { return np.signal(syscall.SIGKILL) })
	<-np.done
}

// upgradeInPlace handles an upgrade's restart request of an adopted master
// with nginx's binary upgrade. done says the request was answered: np is
// then the new master to supervise, or nil (the old one goes on, and the
// request has the error). Not done: restart the cell as for any other
// request (not an upgrade, or a master that would ignore USR2).
func (c *slot) upgradeInPlace(ctx context.Context, p *proc, req *restartReq) (np *proc, done bool) {
	if req.kind != restartUpgrade || !p.adopted || !c.takesUSR2(p.pid) {
		return nil, false
	}
	np, err := c.binaryUpgrade(ctx, p)
	req.done <- err
	return np, true
}

// takesUSR2 reports whether nginx's master pid would take USR2: only when
// its parent is no longer the process that started it (nginx compares
// getppid() with its parent at start). A master a previous agent started
// has init or a subreaper as parent now; one whose parent is this process
// (a test's supervisor adopting what it started itself) ignores it.
func (c *slot) takesUSR2(pid int) bool {
	var f []string
	if err := c.readAsCell(func() (err error) { f, err = liveStat(pid); return err }); err != nil {
		return false
	}
	ppid, err := strconv.Atoi(f[1])
	return err == nil && ppid != os.Getpid()
}
