package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"cellvisor/cellapi"
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

	// restartCh carries operator restarts to the slot's routine, which owns
	// the process.
	restartCh chan *restartReq
	// ctl serialises drain, undrain and restart of this slot.
	ctl sync.Mutex
	// released wakes a slot waiting for its first release.
	released chan struct{}

	mu         sync.Mutex // guards the following fields
	group      cgroup.Group
	api        *cellapi.Client
	state      State
	reason     string
	pid        int
	restarts   int
	lastExit   string
	readySince time.Time
	seq        int64
	drained    bool
	opRestarts []time.Time // accepted operator restarts, for the rate limit
	// opRestartsTotal counts accepted operator restarts since the agent
	// started; restarts counts the crash restarts.
	opRestartsTotal int
	secSeen         int64 // refused private calls already reported
}

// restartReq is an operator restart; done receives nil once the new cell is
// ready, or why the restart failed.
type restartReq struct {
	done chan error
}

func newSlot(s *Supervisor, spec runtime.Slot, pool string) *slot {
	return &slot{
		s: s, spec: spec, pool: pool, state: StateStopped,
		log:       s.log.With(zap.String("cell", spec.Name)),
		restartCh: make(chan *restartReq),
		released:  make(chan struct{}, 1),
		drained:   spec.Drained(),
	}
}

// proc is one started cell master.
type proc struct {
	cmd     *exec.Cmd
	pid     int
	done    chan struct{}
	err     error // valid once done is closed
	started time.Time
	logs    logMark // where the cell's logs ended at its start
}

// firstOutcome counts this slot towards the supervisor's Ready once.
func (c *slot) firstOutcome() { c.outcome.Do(c.s.pending.Done) }

// set records a state; a ready cell of a drained slot is drained.
func (c *slot) set(st State, reason string) {
	c.mu.Lock()
	prev := c.state
	if st == StateReady && c.drained {
		st = StateDrained
	}
	c.state, c.reason = st, reason
	switch {
	case st == StateReady || st == StateDrained:
		if c.readySince.IsZero() {
			c.readySince = time.Now()
		}
	default:
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
	for {
		meta, err := runtime.Current(c.spec)
		if err == nil {
			c.mu.Lock()
			c.seq = meta.Sequence
			c.mu.Unlock()
			break
		}
		c.set(StateDegraded, "runtime missing: "+err.Error())
		c.firstOutcome()
		select {
		case <-ctx.Done():
			c.set(StateStopped, "agent stopping")
			return
		case <-c.released:
		}
	}
	tr := tracker{p: c.s.o.Policy, jitter: c.s.o.Jitter}
	var pending *restartReq // an operator restart waiting for the new cell
	defer func() {
		if pending != nil {
			pending.done <- errors.New("agent stopping")
		}
	}()
	for {
		var readyFor time.Duration
		p, err := c.start()
		if err != nil {
			c.mu.Lock()
			c.lastExit = "start failed: " + err.Error()
			c.mu.Unlock()
			c.log.Error("start cell", zap.Error(err))
			if pending != nil {
				pending.done <- err
				pending = nil
			}
		} else {
			out := c.supervise(ctx, p, &pending)
			if out.stopped {
				c.set(StateStopped, "agent stopping")
				return
			}
			if out.restart != nil {
				// An operator restart (gracefulStop left nothing running):
				// start again at once, no backoff.
				pending = out.restart
				c.set(StateDegraded, "restarting")
				continue
			}
			readyFor = out.readyFor
			c.afterExit(p, out.why)
			if pending != nil {
				pending.done <- fmt.Errorf("cell exited before it was ready: %s", c.status().LastExit)
				pending = nil
			}
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
	// A killed master leaves its private socket behind, and nginx would fail
	// to bind it; nothing of the cell runs now, so it is stale.
	if err := os.Remove(c.spec.PrivateSocket()); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("remove stale private socket: %w", err)
	}
	stderr, err := os.OpenFile(filepath.Join(c.spec.LogsDir(), "stderr.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	logs := markLogs(c.spec.LogsDir())
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
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{}), started: time.Now(), logs: logs}
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

// outcome is how one run of a cell ended.
type outcome struct {
	readyFor time.Duration // how long it was ready
	stopped  bool          // stopped because ctx ended
	why      string        // why the agent stopped it itself, if it did
	restart  *restartReq   // stopped for an operator restart
}

// supervise waits for readiness, exit, an operator restart or cancellation.
// Once the cell is ready it answers a pending restart request.
func (c *slot) supervise(ctx context.Context, p *proc, pending **restartReq) outcome {
	rctx, cancel := context.WithTimeout(ctx, c.s.o.ReadyTimeout)
	defer cancel()
	probe := make(chan error, 1)
	go func() { probe <- c.probe(rctx, p.done) }()
	var out outcome
	var readyAt time.Time
	finish := func() outcome {
		cancel()
		if probe != nil {
			<-probe
		}
		if !readyAt.IsZero() {
			out.readyFor = time.Since(readyAt)
		}
		return out
	}
	for {
		select {
		case err := <-probe:
			probe = nil
			switch {
			case err == nil:
				readyAt = time.Now()
				c.onReady()
				if *pending != nil {
					(*pending).done <- nil
					*pending = nil
				}
			case ctx.Err() == nil && !closed(p.done):
				out.why = fmt.Sprintf("not ready within %s (%v)", c.s.o.ReadyTimeout, err)
				c.log.Warn("cell not ready in time; stopping it", zap.Error(err))
				c.stop(p, time.Second)
			}
		case req := <-c.restartCh:
			c.gracefulStop(ctx, p)
			out.restart = req
			return finish()
		case <-p.done:
			return finish()
		case <-ctx.Done():
			c.stop(p, c.s.o.StopTimeout)
			out.stopped = true
			return finish()
		}
	}
}

// onReady marks the cell ready (or drained) and locks down its private socket.
func (c *slot) onReady() {
	if err := os.Chmod(c.spec.PrivateSocket(), 0o600); err != nil {
		c.log.Warn("private socket", zap.Error(err))
	}
	c.set(StateReady, "")
	c.firstOutcome()
}

// probe waits until the cell is ready: first until its public listener
// accepts (bare dials: a refused loopback dial costs microseconds, and eight
// cells starting together on a small host should not compete with HTTP
// clients), then until a worker answers /.cellvisor/ready (200, or 503
// while drained). A listener alone is not enough: nginx listens before its
// initialisation is done and can still fail and exit. It polls every
// millisecond for the first 250ms (a cell is up within tens of
// milliseconds), then backs off to 20ms; it gives up when the process exits
// or ctx ends.
func (c *slot) probe(ctx context.Context, exited <-chan struct{}) error {
	addr := net.JoinHostPort(c.s.o.ProbeHost, strconv.Itoa(c.spec.HTTPPort))
	url := "http://" + addr + "/.cellvisor/ready"
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	defer hc.CloseIdleConnections()
	start := time.Now()
	delay := time.Millisecond
	listening := false
	var d net.Dialer
	var last error
	for {
		if !listening {
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			conn, err := d.DialContext(dctx, "tcp", addr)
			cancel()
			if err == nil {
				conn.Close()
				listening = true
			}
			last = err
		}
		if listening {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusServiceUnavailable {
					return nil
				}
				err = fmt.Errorf("readiness answered %s", resp.Status)
			}
			last = err
		}
		if time.Since(start) > 250*time.Millisecond {
			delay = min(delay*2, 20*time.Millisecond)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (last: %v)", url, ctx.Err(), last)
		case <-exited:
			t.Stop()
			return errors.New("exited before it was ready")
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
	} else if detail := exitDetail(c.spec.LogsDir(), p.logs, p.pid, p.started); detail != "" {
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

// reopenLogs asks the running cell to reopen its log files (SIGUSR1).
func (c *slot) reopenLogs() error {
	pid, _ := c.running()
	if pid == 0 {
		return nil
	}
	return syscall.Kill(pid, syscall.SIGUSR1)
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
		Name:             c.spec.Name,
		Pool:             c.pool,
		Assignment:       Unassigned,
		State:            c.state,
		Reason:           c.reason,
		PID:              c.pid,
		HTTPPort:         c.spec.HTTPPort,
		HTTPSPort:        c.spec.HTTPSPort,
		Restarts:         c.restarts,
		OperatorRestarts: c.opRestartsTotal,
		LastExit:         c.lastExit,
		Sequence:         c.seq,
		Drained:          c.drained,
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
		st.Cgroup, st.CgroupPaths = g.Path(), g.Paths()
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
