package supervisor

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"go.uber.org/zap"
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
}

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
		t := c.s.clk.NewTicker(p.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			}
			err := checkAlive(ctx, addr, p.Timeout)
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
	return askReady(ctx, addr)
}

// onLiveness records a check's result and executes the machine's decision:
// it returns why the agent stops the cell when it is to be restarted.
func (c *slot) onLiveness(err error) (restartWhy string) {
	p := c.s.settings().Liveness
	c.mu.Lock()
	before := c.live.Failures
	c.live.Checks++
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
