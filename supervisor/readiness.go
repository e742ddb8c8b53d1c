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
// or ctx ends.
func (c *slot) probe(ctx context.Context, exited <-chan struct{}) error {
	addr := net.JoinHostPort(c.s.o.ProbeHost, strconv.Itoa(c.spec.HTTPPort))
	url := "http://" + addr + "/.cellvisor/ready"
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
