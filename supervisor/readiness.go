package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/backoff"
)

// onReady marks the cell ready (or drained) and locks down its private socket.
func (c *slot) onReady() {
	if err := os.Chmod(c.spec.PrivateSocket(), 0o600); err != nil {
		c.log.Warn("private socket", zap.Error(err))
	}
	c.on(evReady, "")
	c.firstOutcome()
}

// probe waits until the cell is ready: first until its public listener
// accepts (bare dials: a refused loopback dial costs microseconds, and eight
// cells starting together on a small host should not compete with HTTP
// clients), then until a worker answers /.cellvisor/ready (200, or 503
// while drained). A listener alone is not enough: nginx listens before its
// initialisation is done and can still fail and exit. It polls every
// millisecond (jittered) for the first 250ms (a cell is up within tens of
// milliseconds), then backs off to 20ms; it gives up when the process exits
// or ctx ends. With the cell's listeners held (held), the port accepts all
// along and probeHeld waits on one request instead.
func (c *slot) probe(ctx context.Context, exited <-chan struct{}, held bool) error {
	addr := net.JoinHostPort(c.s.o.ProbeHost, strconv.Itoa(c.spec.HTTPPort))
	url := "http://" + addr + "/.cellvisor/ready"
	if held {
		return c.probeHeld(ctx, exited, url)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	defer hc.CloseIdleConnections()
	start := c.s.clk.Now()
	b := &backoff.Backoff{Initial: time.Millisecond, Max: 20 * time.Millisecond, Clock: c.s.clk}
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
			if last = askReady(ctx, hc, url); last == nil {
				return nil
			}
		}
		delay := b.Steady()
		if c.s.clk.Since(start) > 250*time.Millisecond {
			delay = b.Next()
		}
		t := c.s.clk.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (last: %v)", url, ctx.Err(), last)
		case <-exited:
			t.Stop()
			return errors.New("exited before it was ready")
		case <-t.C():
		}
	}
}

// probeHeld is probe for a cell whose listeners the agent holds (listen.go):
// the port accepts from the start, so one request is sent, which waits in
// the listen backlog until a worker takes and answers it. Nothing polls
// while the cell starts. A request that fails early (a connection reset)
// is sent again after a pause, from 1ms growing to 20ms.
func (c *slot) probeHeld(ctx context.Context, exited <-chan struct{}, url string) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-rctx.Done():
		}
	}()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer hc.CloseIdleConnections()
	b := &backoff.Backoff{Initial: time.Millisecond, Max: 20 * time.Millisecond, Clock: c.s.clk}
	for {
		err := askReady(rctx, hc, url)
		if err == nil {
			return nil
		}
		if closed(exited) {
			return errors.New("exited before it was ready")
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last: %v)", url, ctx.Err(), err)
		}
		t := c.s.clk.NewTimer(b.Next())
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (last: %v)", url, ctx.Err(), err)
		case <-exited:
			t.Stop()
			return errors.New("exited before it was ready")
		case <-t.C():
		}
	}
}

// askReady asks url once: nil when a worker answered 200 (ready) or 503
// (drained, and up).
func askReady(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusServiceUnavailable {
		return nil
	}
	return fmt.Errorf("readiness answered %s", resp.Status)
}
