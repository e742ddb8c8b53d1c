package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"cellvisor/cgroup"
	"cellvisor/runtime"
)

// slot runs one cell slot.
type slot struct {
	s       *Supervisor
	spec    runtime.Slot
	pool    string
	log     *zap.Logger
	outcome sync.Once

	mu         sync.Mutex // guards the following fields
	group      cgroup.Group
	state      State
	reason     string
	pid        int
	restarts   int
	lastExit   string
	readySince time.Time
	seq        int64
}

func newSlot(s *Supervisor, spec runtime.Slot, pool string) *slot {
	return &slot{
		s: s, spec: spec, pool: pool, state: StateStopped,
		log: s.log.With(zap.String("cell", spec.Name)),
	}
}

// proc is one started cell master.
type proc struct {
	cmd     *exec.Cmd
	pid     int
	done    chan struct{}
	err     error // valid once done is closed
	started time.Time
}

// firstOutcome counts this slot towards the supervisor's Ready once.
func (c *slot) firstOutcome() { c.outcome.Do(c.s.pending.Done) }

func (c *slot) set(st State, reason string) {
	c.mu.Lock()
	prev := c.state
	c.state, c.reason = st, reason
	if st == StateReady {
		c.readySince = time.Now()
	} else {
		c.readySince = time.Time{}
	}
	c.mu.Unlock()
	if prev != st {
		c.log.Info("cell state", zap.String("from", string(prev)), zap.String("to", string(st)), zap.String("reason", reason))
	}
}

// run is the slot's routine: start, wait for ready or exit, restart with
// backoff, until ctx is cancelled.
func (c *slot) run(ctx context.Context) {
	defer c.firstOutcome()
	if c.pool == "" {
		c.set(StateStopped, "unassigned")
		return
	}
	if c.s.o.Refusal != nil {
		c.set(StateStopped, "not started: "+c.s.o.Refusal.Error())
		return
	}
	meta, err := runtime.Current(c.spec)
	if err != nil {
		c.set(StateDegraded, "runtime missing: "+err.Error())
		c.firstOutcome()
		<-ctx.Done()
		c.set(StateStopped, "agent stopping")
		return
	}
	c.mu.Lock()
	c.seq = meta.Sequence
	c.mu.Unlock()
	tr := tracker{p: c.s.o.Policy, jitter: c.s.o.Jitter}
	for {
		var readyFor time.Duration
		p, err := c.start()
		if err != nil {
			c.mu.Lock()
			c.lastExit = "start failed: " + err.Error()
			c.mu.Unlock()
			c.log.Error("start cell", zap.Error(err))
		} else {
			var stopped bool
			var why string
			readyFor, stopped, why = c.supervise(ctx, p)
			if stopped {
				c.set(StateStopped, "agent stopping")
				return
			}
			c.afterExit(p, why)
		}
		c.firstOutcome()
		delay := tr.next(readyFor)
		c.mu.Lock()
		c.restarts++
		reason := c.lastExit
		c.mu.Unlock()
		c.set(StateDegraded, fmt.Sprintf("%s; restart in %s", reason, delay.Round(time.Millisecond)))
		if !sleepCtx(ctx, delay) {
			c.set(StateStopped, "agent stopping")
			return
		}
	}
}

// ensureGroup creates (or updates) the slot's cgroup with its limits.
func (c *slot) ensureGroup() (cgroup.Group, error) {
	g, err := c.s.o.Cgroups.Ensure(c.spec.Name, c.s.o.Limits)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.group = g
	c.mu.Unlock()
	return g, nil
}

// start launches the cell master inside its cgroup.
func (c *slot) start() (*proc, error) {
	g, err := c.ensureGroup()
	if err != nil {
		return nil, err
	}
	if pids, _ := g.Procs(); len(pids) > 0 {
		// Never start beside leftovers: an orphaned worker would hold the port.
		kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := g.Kill(kctx)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	stderr, err := os.OpenFile(filepath.Join(c.spec.LogsDir(), "stderr.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	cmd := exec.Command(c.s.o.Binary,
		"-p", c.spec.Dir+"/",
		"-c", c.spec.ConfPath(),
		"-e", filepath.Join(c.spec.LogsDir(), "error.log"))
	cmd.Dir = c.spec.Dir
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cgroup.Start(g, cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", c.s.o.Binary, err)
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{}), started: time.Now()}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	c.mu.Lock()
	c.pid = p.pid
	c.mu.Unlock()
	c.log.Debug("cell started", zap.Int("pid", p.pid))
	return p, nil
}

// supervise waits for readiness, exit or cancellation. It returns how long the
// cell was ready, stopped=true once it stopped the cell because ctx ended,
// and why it stopped the cell itself (not ready in time), if it did.
func (c *slot) supervise(ctx context.Context, p *proc) (readyFor time.Duration, stopped bool, why string) {
	rctx, cancel := context.WithTimeout(ctx, c.s.o.ReadyTimeout)
	defer cancel()
	probe := make(chan error, 1)
	go func() { probe <- c.probe(rctx, p.done) }()
	var readyAt time.Time
	for {
		select {
		case err := <-probe:
			probe = nil
			switch {
			case err == nil:
				readyAt = time.Now()
				c.set(StateReady, "")
				c.firstOutcome()
			case ctx.Err() == nil && !closed(p.done):
				why = fmt.Sprintf("not ready within %s (%v)", c.s.o.ReadyTimeout, err)
				c.log.Warn("cell not ready in time; stopping it", zap.Error(err))
				c.stop(p, time.Second)
			}
		case <-p.done:
			cancel()
			if probe != nil {
				<-probe
			}
			if !readyAt.IsZero() {
				readyFor = time.Since(readyAt)
			}
			return readyFor, false, why
		case <-ctx.Done():
			cancel()
			if probe != nil {
				<-probe
			}
			c.stop(p, c.s.o.StopTimeout)
			return 0, true, ""
		}
	}
}

// probe dials the cell's HTTP listener until it accepts, the process exits,
// or ctx ends. It polls every millisecond for the first 250ms (a cell listens
// within tens of milliseconds, and a refused loopback dial costs microseconds),
// then backs off to 20ms.
func (c *slot) probe(ctx context.Context, exited <-chan struct{}) error {
	addr := net.JoinHostPort(c.s.o.ProbeHost, strconv.Itoa(c.spec.HTTPPort))
	start := time.Now()
	delay := time.Millisecond
	var d net.Dialer
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := d.DialContext(dctx, "tcp", addr)
		cancel()
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Since(start) > 250*time.Millisecond {
			delay = min(delay*2, 20*time.Millisecond)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("listener %s: %w", addr, ctx.Err())
		case <-exited:
			t.Stop()
			return errors.New("exited before its listener accepted")
		case <-t.C:
		}
	}
}

// stop stops a cell in stages: SIGQUIT (graceful: in-flight requests finish),
// wait up to grace, SIGKILL the process group, then kill whatever is left in
// the cgroup and wait for the master to be reaped.
func (c *slot) stop(p *proc, grace time.Duration) {
	_ = syscall.Kill(p.pid, syscall.SIGQUIT)
	t := time.NewTimer(grace)
	select {
	case <-p.done:
		t.Stop()
	case <-t.C:
		c.log.Warn("cell did not stop in time; killing it", zap.Duration("grace", grace))
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	c.killLeftovers()
	<-p.done // the master is dead or was SIGKILLed: Wait returns
	c.mu.Lock()
	c.pid = 0
	c.mu.Unlock()
}

// afterExit records an exit (unexpected, or forced with the reason why) and
// kills whatever the master left behind (an orphaned worker keeps the port
// otherwise).
func (c *slot) afterExit(p *proc, forced string) {
	c.killLeftovers()
	why := describeExit(p.err)
	if forced != "" {
		why = forced
	} else if detail := c.lastLogError(); detail != "" && time.Since(p.started) < c.s.o.ReadyTimeout {
		why += ": " + detail
	}
	c.mu.Lock()
	c.pid = 0
	c.lastExit = "exited: " + why
	c.mu.Unlock()
	c.log.Warn("cell exited", zap.String("why", why), zap.Int("pid", p.pid))
}

func (c *slot) killLeftovers() {
	c.mu.Lock()
	g := c.group
	c.mu.Unlock()
	if g == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Kill(ctx); err != nil {
		c.log.Error("kill cell leftovers", zap.Error(err))
	}
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

// killStalePidfile stops a master named by the slot's pid file that runs this
// slot's configuration (so a recycled pid is never touched).
func (c *slot) killStalePidfile() {
	data, err := os.ReadFile(c.spec.PidFile())
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 {
		return
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(c.spec.ConfPath())) {
		return
	}
	c.log.Warn("stopping a cell master left by a previous agent", zap.Int("pid", pid))
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// lastLogError returns the last emerg/alert/crit line of the cell's error
// log or stderr, to say why a start failed.
func (c *slot) lastLogError() string {
	for _, f := range []string{"error.log", "stderr.log"} {
		data, err := readTail(filepath.Join(c.spec.LogsDir(), f), 4096)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			l := lines[i]
			if strings.Contains(l, "[emerg]") || strings.Contains(l, "[alert]") || strings.Contains(l, "[crit]") || strings.HasPrefix(l, "cellvisor-cgexec") {
				return l
			}
		}
	}
	return ""
}

func readTail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(st.Size()-n, 0)
	buf := make([]byte, st.Size()-off)
	_, err = f.ReadAt(buf, off)
	return buf, err
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

func (c *slot) status() SlotStatus {
	c.mu.Lock()
	st := SlotStatus{
		Name:       c.spec.Name,
		Pool:       c.pool,
		Assignment: Unassigned,
		State:      c.state,
		Reason:     c.reason,
		PID:        c.pid,
		HTTPPort:   c.spec.HTTPPort,
		HTTPSPort:  c.spec.HTTPSPort,
		Restarts:   c.restarts,
		LastExit:   c.lastExit,
		Sequence:   c.seq,
	}
	if !c.readySince.IsZero() {
		t := c.readySince
		st.ReadySince = &t
	}
	g := c.group
	c.mu.Unlock()
	if c.pool != "" {
		st.Assignment = Assigned
		st.Limits = c.s.o.Limits
	}
	if g != nil && g.Path() != "" {
		st.Cgroup = g.Path()
		if u, err := g.Usage(); err == nil {
			st.Usage = &u
		}
		if l, err := g.Limits(); err == nil {
			st.Limits = l
		}
	}
	return st
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
