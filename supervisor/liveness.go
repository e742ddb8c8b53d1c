package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/sockstat"
)

// LivenessPolicy is how a ready cell is checked for being alive, like a
// kubelet liveness probe: its readiness path on the public port, on an
// interval, with a timeout. A drained cell's 503 is an answer: only a cell
// that does not answer at all fails.
type LivenessPolicy struct {
	// Interval between checks; zero means 1s, negative turns checks off.
	Interval time.Duration
	// Timeout of one check; zero means 1s.
	Timeout time.Duration
	// FailureThreshold consecutive failed checks make the cell degraded;
	// zero means 3.
	FailureThreshold int
	// RestartThreshold consecutive failed checks restart it through the
	// normal path (stop, the group killed, a restart counted and backed off
	// like a crash); zero means 6. At least FailureThreshold.
	RestartThreshold int
	// BehindGrace is how long a running cell may serve an older release
	// than its switched one (a load or reload taking effect) before it is
	// degraded and reloaded again; zero means 10s. BehindRestart is how
	// long after that it is restarted; zero means 30s (behind.go).
	BehindGrace, BehindRestart time.Duration
}

func (p LivenessPolicy) withDefaults() LivenessPolicy {
	if p.Interval == 0 {
		p.Interval = time.Second
	}
	if p.Timeout == 0 {
		p.Timeout = time.Second
	}
	if p.FailureThreshold == 0 {
		p.FailureThreshold = 3
	}
	if p.RestartThreshold == 0 {
		p.RestartThreshold = 6
	}
	p.RestartThreshold = max(p.RestartThreshold, p.FailureThreshold)
	if p.BehindGrace == 0 {
		p.BehindGrace = 10 * time.Second
	}
	if p.BehindRestart == 0 {
		p.BehindRestart = 30 * time.Second
	}
	return p
}

// LivenessStatus is a slot's liveness as last checked.
type LivenessStatus struct {
	// Failures is the number of consecutive failed checks.
	Failures int `json:"failures"`
	// Checks counts the checks of the running cell.
	Checks int64 `json:"checks"`
	// LastError is why the last check failed ("" when it answered).
	LastError string `json:"last_error,omitempty"`
	// Overloaded says the last check found the cell alive but taking no
	// more connections: it accepted the check's and closed it at once
	// (every connection it can hold is held, by clients).
	Overloaded bool `json:"overloaded,omitempty"`
	// Overloads counts the checks that found it so.
	Overloads int64 `json:"overloads,omitempty"`
	// Sockets are the public port's TCP sockets by state, read from the
	// kernel when the cell was last found overloaded.
	Sockets *sockstat.Counts `json:"sockets,omitempty"`
}

// errOverloaded is a check whose connection the cell accepted and closed
// before any answer, well within the timeout: nginx does that when every
// connection it may hold (worker_connections) is taken. The cell is alive
// and busy: that is no reason to restart it (which would cut every
// tenant's requests), but it is shown, counted and logged.
var errOverloaded = errors.New("the cell accepts connections and closes them at once: every connection it can hold is taken")

// livenessEvent is the machine's event after a check moved the count of
// consecutive failures from before to after, if any: pure.
func livenessEvent(before, after int, p LivenessPolicy) (event, bool) {
	switch {
	case after == 0 && before >= p.FailureThreshold:
		return evResponsive, true
	case after >= p.RestartThreshold:
		return evHung, true
	case after >= p.FailureThreshold && before < p.FailureThreshold:
		return evUnresponsive, true
	}
	return 0, false
}

// startLiveness checks the running cell every interval until the returned
// stop is called (or ctx ends); results arrive on the channel, one check at
// a time. Checks are off (a nil channel) when the interval is negative.
func (c *slot) startLiveness(ctx context.Context) (<-chan error, func()) {
	p := c.s.settings().Liveness
	if p.Interval < 0 {
		return nil, func() {}
	}
	c.mu.Lock()
	c.live = LivenessStatus{}
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	results := make(chan error)
	done := make(chan struct{})
	go func() {
		defer close(done)
		addr := net.JoinHostPort(c.s.o.ProbeHost, strconv.Itoa(c.spec.HTTPPort))
		var sockRead time.Time
		t := c.s.clk.NewTicker(p.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			}
			err := checkAlive(ctx, addr, p.Timeout)
			if errors.Is(err, errOverloaded) && c.s.clk.Since(sockRead) >= sockstatEvery {
				// Under a flood the kernel's socket table is large: read
				// it when the overload starts and then seldom, not at
				// every check (the agent has a quarter of a CPU).
				sockRead = c.s.clk.Now()
				if n, serr := sockstat.Port("", c.spec.HTTPPort); serr == nil {
					err = &overload{n}
				}
			}
			select {
			case results <- err:
			case <-ctx.Done():
				return
			}
		}
	}()
	return results, func() { cancel(); <-done }
}

// checkAlive asks the readiness path once: 200 (ready) and 503 (drained)
// are answers; no answer within timeout, a refused connection or another
// status are not.
func checkAlive(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := askReady(ctx, addr)
	if err != nil && ctx.Err() == nil && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		return fmt.Errorf("%w (%v)", errOverloaded, err)
	}
	return err
}

// sockstatEvery is how often an overloaded cell's sockets are counted.
const sockstatEvery = 10 * time.Second

// overload is errOverloaded with the port's sockets by state.
type overload struct{ n sockstat.Counts }

func (o *overload) Error() string { return errOverloaded.Error() + ": " + o.n.String() }
func (o *overload) Unwrap() error { return errOverloaded }

// onLiveness records a check's result and executes the machine's decision:
// it returns why the agent stops the cell when it is to be restarted.
func (c *slot) onLiveness(err error) (restartWhy string) {
	c.retryReload()
	p := c.s.settings().Liveness
	c.mu.Lock()
	before := c.live.Failures
	c.live.Checks++
	wasOverloaded := c.live.Overloaded
	c.live.Overloaded = errors.Is(err, errOverloaded)
	if c.live.Overloaded {
		// Alive: the failures so far were not a hang either.
		c.live.Overloads++
		var o *overload
		if errors.As(err, &o) {
			n := o.n
			c.live.Sockets = &n
		}
		c.live.Failures, c.live.LastError = 0, err.Error()
		c.mu.Unlock()
		if !wasOverloaded {
			c.log.Warn("cell overloaded: it is alive but takes no more connections; not restarting it", zap.Error(err))
		}
		if before >= p.FailureThreshold {
			c.on(evResponsive, "")
		}
		return ""
	}
	if wasOverloaded {
		c.log.Info("cell takes connections again", zap.Int64("overloaded_checks", c.live.Overloads))
	}
	if err == nil {
		c.live.Failures, c.live.LastError = 0, ""
	} else {
		c.live.Failures++
		c.live.LastError = err.Error()
	}
	after := c.live.Failures
	c.mu.Unlock()
	ev, ok := livenessEvent(before, after, p)
	if !ok {
		return ""
	}
	switch ev {
	case evResponsive:
		c.log.Info("cell answers again", zap.Int("failed_checks", before))
		c.on(ev, "")
	case evUnresponsive:
		reason := fmt.Sprintf("not answering: %d liveness checks in a row failed (%v)", after, err)
		c.log.Warn("cell not answering", zap.Int("failed_checks", after), zap.Error(err))
		c.on(ev, reason)
	case evHung:
		why := fmt.Sprintf("not answering: %d liveness checks in a row failed (%v); restarted", after, err)
		if c.on(ev, why) == actKill {
			c.log.Error("cell hung; restarting it", zap.Int("failed_checks", after), zap.Error(err))
			return why
		}
	}
	return ""
}
