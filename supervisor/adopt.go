package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"cellvisor/cgroup"
	"cellvisor/internal/atomicfile"
	"cellvisor/internal/safefile"
	"cellvisor/runtime"
)

// A cell outlives the agent that started it. On start the agent adopts each
// slot's running master, but only once it has proved the master is the
// process an agent started for this slot: the pid file and the master
// record written at its start name the same pid, that pid is in the slot's
// cgroup, and its executable, command line and kernel start time are the
// recorded ones. A recycled pid, another slot's master or an unrelated
// process is never adopted nor signalled; the slot's cgroup is killed and the
// cell started fresh instead.

// masterRecord identifies a started master; it is written atomically beside
// the slot's pid file when the master starts.
type masterRecord struct {
	PID int `json:"pid"`
	// StartTicks is the process's start time in clock ticks since boot
	// (/proc/<pid>/stat field 22): a recycled pid has another.
	StartTicks uint64 `json:"start_ticks"`
	Binary     string `json:"binary"`
	Conf       string `json:"conf"`
	Cgroup     string `json:"cgroup"`
}

// maxSmallFile bounds the pid file and the records read at start.
const maxSmallFile = 64 << 10

func (c *slot) recordPath() string {
	return filepath.Join(filepath.Dir(c.spec.PidFile()), "master.json")
}

// writeRecord records the master just started (our child: its pid cannot be
// recycled before we reap it). The record is in the run directory and names
// a process of this boot only, so it is replaced without fsyncs: a crash of
// the host ends the master too, and a record left empty or stale is
// refused at adoption (readRecord; the start time in adopt).
func (c *slot) writeRecord(pid int, g cgroup.Group, exited <-chan struct{}) {
	// Only the start time: the process may still be the join helper, its
	// exec under way (reading its command line would wait on that), and
	// the record names the binary it execs.
	ticks, err := c.childStartTicks(pid, exited)
	if err == nil {
		rec := masterRecord{PID: pid, StartTicks: ticks, Binary: c.s.binary, Conf: c.spec.ConfPath(), Cgroup: g.Path()}
		var b []byte
		if b, err = json.Marshal(rec); err == nil {
			err = atomicfile.Replace(c.recordPath(), append(b, '\n'), 0o600)
		}
	}
	if err == nil {
		c.writeRuntimeRecord(pid, ticks)
	}
	if err != nil {
		c.log.Warn("record cell master: it cannot be adopted after an agent restart", zap.Int("pid", pid), zap.Error(err))
	}
}

// childHiddenFor bounds childStartTicks's wait for a child's /proc entry.
const childHiddenFor = time.Second

// childStartTicks reads the start time of pid, a child of ours (its pid
// cannot be recycled before we reap it). While the join helper switches to
// the cell's user, from its setuid until its exec, the process is not
// dumpable: under ProtectProc=invisible neither the agent nor the cell's
// user sees its /proc entry (a VM run lost cell-02's record so, and the next
// agent did not adopt it). So a missing entry is read again, bounded, until
// exited is closed.
func (c *slot) childStartTicks(pid int, exited <-chan struct{}) (uint64, error) {
	var ticks uint64
	read := func() (err error) { ticks, err = startTicks(pid); return err }
	deadline := c.s.clk.Now().Add(childHiddenFor)
	for {
		err := c.readAsCell(read)
		if err == nil || !errors.Is(err, fs.ErrNotExist) || c.s.clk.Now().After(deadline) {
			return ticks, err
		}
		t := c.s.clk.NewTimer(2 * time.Millisecond)
		select {
		case <-exited:
			t.Stop()
			return ticks, err
		case <-t.C():
		}
	}
}

// removeRecord removes the slot's master record, if there is one (with
// unlink(2) alone: os.Remove tries rmdir(2) too when unlink fails, and a
// cold start has no record to remove).
func (c *slot) removeRecord() {
	if err := unix.Unlink(c.recordPath()); err != nil && err != unix.ENOENT {
		c.log.Warn("remove cell master record", zap.String("path", c.recordPath()), zap.Error(err))
	}
	c.removeRuntimeRecord()
}

// wantUID is the uid this slot's cells run as.
func (c *slot) wantUID() int {
	if u := c.user(); u != nil {
		return int(u.UID)
	}
	return os.Geteuid()
}

// deletedSuffix is what /proc/PID/exe adds to the path of a file that was
// removed or replaced since the process exec'd it: a package upgrade renames
// a new binary over the old one, and the master keeps running the old file.
// Such a master is still the recorded one (its start time, command line and
// cgroup say so) and is adopted; status says it runs a superseded runtime.
const deletedSuffix = " (deleted)"

// mismatch says why a process named by a slot's pid file is not the master
// recorded for it ("" when it is). It is pure: want is what this agent
// would have started, rec what was recorded at start, pidFile the pid the
// pid file names, members the pids in the slot's cgroup, id what /proc says.
func mismatch(want, rec masterRecord, pidFile int, members []int, id procIdentity) string {
	switch {
	case pidFile != rec.PID:
		return fmt.Sprintf("the pid file names %d, the master record %d", pidFile, rec.PID)
	case !slices.Contains(members, pidFile):
		return fmt.Sprintf("pid %d is not in the cell's cgroup", pidFile)
	case rec.Binary != want.Binary || rec.Conf != want.Conf || rec.Cgroup != want.Cgroup:
		return fmt.Sprintf("the master record (%s -c %s in %s) is not this slot's (%s -c %s in %s)",
			rec.Binary, rec.Conf, rec.Cgroup, want.Binary, want.Conf, want.Cgroup)
	case id.startTicks != rec.StartTicks:
		return fmt.Sprintf("pid %d started at tick %d, the recorded master at %d: the pid was recycled", pidFile, id.startTicks, rec.StartTicks)
	case id.exe != want.Binary && id.exe != want.Binary+deletedSuffix:
		return fmt.Sprintf("pid %d runs %s, not %s", pidFile, id.exe, want.Binary)
	case !namesConf(id.args, want.Conf):
		return fmt.Sprintf("pid %d's command line does not name %s", pidFile, want.Conf)
	}
	return ""
}

// namesConf reports whether args hold "-c conf".
func namesConf(args []string, conf string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-c" && args[i+1] == conf {
			return true
		}
	}
	return false
}

// readPid reads a pid file: a positive decimal pid, nothing else.
func readPid(ctx context.Context, path string) (int, error) {
	b, err := safefile.ReadFile(ctx, path, maxSmallFile)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("%s: not a pid: %q", path, bytes.TrimSpace(b))
	}
	return pid, nil
}

// readRecord reads the slot's master record.
func (c *slot) readRecord(ctx context.Context) (masterRecord, error) {
	var rec masterRecord
	b, err := safefile.ReadFile(ctx, c.recordPath(), maxSmallFile)
	if err != nil {
		return rec, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return rec, fmt.Errorf("%s: %w", c.recordPath(), err)
	}
	return rec, nil
}

// adopt verifies the master named by the slot's pid file and returns it
// watched through a pidfd, or why it is not this slot's master.
func (c *slot) adopt(ctx context.Context, g cgroup.Group, members []int) (*proc, string) {
	pid, err := readPid(ctx, c.spec.PidFile())
	if err != nil {
		return nil, "pid file: " + err.Error()
	}
	rec, err := c.readRecord(ctx)
	if err != nil {
		return nil, "master record: " + err.Error()
	}
	// Open the pidfd before verifying: once the identity is checked, the
	// descriptor refers to that process whatever becomes of the pid.
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Sprintf("pidfd of %d: %v", pid, err)
	}
	id, err := c.identify(pid)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Sprintf("identify %d: %v", pid, err)
	}
	want := masterRecord{Binary: c.s.binary, Conf: c.spec.ConfPath(), Cgroup: g.Path()}
	why := mismatch(want, rec, pid, members, id)
	if why == "" && id.uid != c.wantUID() {
		why = fmt.Sprintf("pid %d runs as uid %d, this slot's cells as %d (cell_users or the users changed)", pid, id.uid, c.wantUID())
	}
	if why != "" {
		unix.Close(fd)
		return nil, why
	}
	p, err := watchPidfd(pid, fd) // owns fd from here, closed on an error too
	if err != nil {
		return nil, err.Error()
	}
	p.started = c.s.clk.Now()
	p.logs = markLogs(c.spec.LogsDir())
	return p, ""
}

// recover runs before the slot's routine: it adopts the slot's running
// master, or stops whatever runs in the slot's cgroup and says why.
func (c *slot) recover(ctx context.Context, g cgroup.Group) {
	members, err := g.Procs()
	if err != nil {
		c.log.Warn("list cell processes left by a previous agent", zap.Error(err))
	}
	if len(members) == 0 {
		c.removeRecord()
		c.vacant = err == nil
		return
	}
	why := ""
	switch {
	case c.s.o.Refusal != nil:
		why = "cells are refused: " + c.s.o.Refusal.Error()
	case c.poolName() == "":
		why = "the slot is unassigned"
	default:
		if _, err := runtime.Current(c.spec); err != nil {
			why = "no active release: " + err.Error()
			break
		}
		p, reason := c.adopt(ctx, g, members)
		if p != nil {
			c.mu.Lock()
			c.adopted, c.group, c.pid, c.answered = p, g, p.pid, true
			c.served = 0 // asked at its first liveness check (checkBehind)
			c.mu.Unlock()
			c.adoptRuntime(ctx, p.pid)
			return
		}
		why = reason
	}
	c.log.Warn("not adopting the processes left in the cell's cgroup; stopping them", zap.String("why", why), zap.Ints("pids", members))
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := g.Kill(kctx); err != nil {
		c.log.Warn("stop processes left by a previous agent", zap.Error(err))
	} else {
		c.vacant = true
	}
	c.removeRecord()
}

// recoverUngrouped handles a master left by a previous agent where cells
// have no cgroup (limits not enforced): without a group its leftovers could
// not be cleaned up after an exit, so a verified master is stopped by its
// process group and started fresh; anything else is left alone.
func (c *slot) recoverUngrouped(ctx context.Context) {
	defer c.removeRecord()
	pid, err := readPid(ctx, c.spec.PidFile())
	if err != nil {
		return
	}
	rec, err := c.readRecord(ctx)
	if err != nil {
		return
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	id, err := c.identify(pid)
	if err != nil {
		return
	}
	want := masterRecord{Binary: c.s.binary, Conf: c.spec.ConfPath(), Cgroup: ""}
	if why := mismatch(want, rec, pid, []int{pid}, id); why != "" || id.pgid != pid {
		c.log.Info("the pid file names no master of this slot; leaving it alone", zap.Int("pid", pid), zap.String("why", why))
		return
	}
	c.log.Warn("stopping a cell master left by a previous agent (no cgroup to adopt it in)", zap.Int("pid", pid))
	_ = c.asCell(func() error { return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) })
	_ = c.asCell(func() error { return unix.Kill(-pid, unix.SIGKILL) })
}

// watchPidfd returns a proc for a master that is not our child, whose done
// closes when it exits (its pidfd becomes readable) or when release is
// called. The pidfd waits on the runtime's poller, made non-blocking with
// fcntl(2) (pidfd_open's own flag needs Linux 5.10, its poll support came
// with it in 5.3): no thread is held for the master's life, as a blocking
// poll(2) held one for each adopted cell before. A pidfd the poller
// refuses fails the adoption, and the cell is restarted instead. fd is
// watchPidfd's from the call on: it is closed on an error too.
func watchPidfd(pid, fd int) (*proc, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pidfd of %d: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	if err := f.SetReadDeadline(time.Time{}); err != nil { // os.ErrNoDeadline: not on the poller
		f.Close()
		return nil, fmt.Errorf("pidfd of %d: %w", pid, err)
	}
	p := &proc{pid: pid, done: make(chan struct{}), pidfd: f, adopted: true}
	go p.watch()
	return p, nil
}

// watch waits on the poller until the master exits or the watch is
// released (a read deadline in the past), then closes the pidfd and done.
func (p *proc) watch() {
	err := awaitExit(p.pidfd)
	switch {
	case err == nil:
		p.err = errAdoptedExit
	case errors.Is(err, os.ErrDeadlineExceeded):
		p.err = errReleased
	default:
		p.err = fmt.Errorf("watch adopted master: %w", err)
	}
	p.mu.Lock()
	p.pidfd.Close()
	p.pidfd = nil
	p.mu.Unlock()
	close(p.done)
}

var (
	// errAdoptedExit is the exit of a master that is not our child: its
	// status went to its new parent.
	errAdoptedExit = errors.New("adopted master exited (its exit status went to its new parent)")
	errReleased    = errors.New("no longer watched")
)

// signal sends sig to the master: through its pidfd when adopted, so a
// recycled pid is never signalled.
func (p *proc) signal(sig unix.Signal) error {
	if !p.adopted {
		return p.cmd.Process.Signal(sig)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd == nil {
		return os.ErrProcessDone
	}
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); err != nil {
		return err
	}
	return serr
}

// release stops watching an adopted master that is left running.
func (p *proc) release() {
	if !p.adopted {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd != nil {
		_ = p.pidfd.SetReadDeadline(time.Unix(1, 0))
	}
}

// recoverAll adopts or cleans up every slot's cell left by a previous agent,
// in parallel, and removes cell cgroups no slot owns.
func (s *Supervisor) recoverAll(ctx context.Context) {
	start := s.clk.Now()
	names, err := s.o.Cgroups.List()
	if err != nil {
		s.log.Warn("list cell cgroups", zap.Error(err))
	}
	var wg sync.WaitGroup
	for _, name := range names {
		if _, ok := s.o.Topology.Slot(name); ok {
			continue
		}
		s.log.Info("removing stale cell cgroup", zap.String("cell", name))
		if g, err := s.o.Cgroups.Open(name); err == nil {
			kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := g.Delete(kctx); err != nil {
				s.log.Warn("remove stale cell cgroup", zap.String("cell", name), zap.Error(err))
			}
			cancel()
		}
	}
	for _, c := range s.slots {
		if s.o.Cgroups.Mode() != cgroup.ModeUnenforced && (c.prepared != nil || !slices.Contains(names, c.spec.Name)) {
			// No group before this agent's (Prepare may be making it now):
			// nothing of a previous agent's runs there. Told here, without
			// a goroutine: every slot of a cold start is so.
			c.removeRecord()
			c.vacant = true
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.o.Cgroups.Mode() == cgroup.ModeUnenforced {
				c.recoverUngrouped(ctx)
				return
			}
			g, err := s.o.Cgroups.Open(c.spec.Name)
			if err != nil {
				c.log.Warn("open cell cgroup", zap.Error(err))
				return
			}
			c.recover(ctx, g)
		}()
	}
	wg.Wait()
	adopted := 0
	for _, c := range s.slots {
		if c.adopted != nil {
			adopted++
		}
	}
	s.log.Info("recovered cells of a previous agent", zap.Int("adopted", adopted), zap.Duration("took", s.clk.Since(start)))
}

// resyncAdopted has an adopted cell that runs another release than the
// slot's active one take it (loaded as data where it can, else reloaded):
// the previous agent switched the release and was killed before the cell
// took it. Until the cell is ready nothing else sees what it runs, so this
// happens before it is marked ready; a cell whose status cannot be read is
// reloaded (a graceful reload drops nothing).
func (c *slot) resyncAdopted(ctx context.Context) {
	meta, err := runtime.Current(c.spec)
	if err != nil {
		return // no release: the slot's routine stops it
	}
	sctx, cancel := context.WithTimeout(ctx, cellStatusTimeout)
	defer cancel()
	cs, err := c.cellStatus(sctx)
	if err == nil && cs != nil && cs.Sequence == meta.Sequence {
		return
	}
	var running int64
	if cs != nil {
		running = cs.Sequence
	}
	c.log.Info("adopted cell does not run the active release; applying it",
		zap.Int64("running", running), zap.Int64("active", meta.Sequence), zap.NamedError("status", err))
	if _, err := c.s.apply(sctx, c.spec.Name); err != nil {
		c.log.Warn("apply the active release to the adopted cell", zap.Error(err))
	}
}
