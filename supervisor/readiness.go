package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/backoff"
)

// onReady marks the cell ready (or drained) and locks down its private socket.
func (c *slot) onReady() {
	// A cell of its own user made its socket 0770 (umask 007), its group
	// the agent's and its own alone; the agent's cell's is the agent's.
	if c.user() == nil {
		if err := os.Chmod(c.spec.PrivateSocket(), 0o600); err != nil {
			c.log.Warn("private socket", zap.Error(err))
		}
	}
	c.mu.Lock()
	if !c.reloadPending && c.served == 0 {
		// A master that answers serves the release it read at its start:
		// the switched one, unless a switch came while it was starting
		// (then a reload is pending, and what it serves is asked later:
		// checkBehind).
		c.served = c.seq
	}
	c.mu.Unlock()
	c.on(evReady, "")
	c.firstOutcome()
	c.mu.Lock()
	c.answered = true
	pid, pending := c.pid, c.reloadPending
	c.mu.Unlock()
	if pending && pid != 0 {
		// A release switched while the master was starting: it may have
		// read the one before. Now that it answers, it can be reloaded.
		if err := c.hup(pid); err != nil {
			c.log.Warn("deferred reload", zap.Error(err))
		} else {
			c.log.Info("deferred reload sent: the release was switched while the cell was starting")
		}
	}
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
	url := "http://" + addr + readyPath // in its errors
	if held {
		return c.probeHeld(ctx, exited, addr, url)
	}
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
			actx, cancel := context.WithTimeout(ctx, time.Second)
			last = askReady(actx, addr)
			cancel()
			if last == nil {
				return nil
			}
		}
		delay := b.Steady()
		if c.s.clk.Since(start) > 250*time.Millisecond {
			delay = b.Next()
		}
		if err := c.pause(ctx, exited, delay, url, last); err != nil {
			return err
		}
	}
}

// errExitedBeforeReady is a probe's answer when the master exits first.
var errExitedBeforeReady = errors.New("exited before it was ready")

// pause waits d on the slot's clock between two tries of a probe of url:
// it returns ctx's end (with the last try's error) or the master's exit,
// whichever comes first, or nil after d.
func (c *slot) pause(ctx context.Context, exited <-chan struct{}, d time.Duration, url string, last error) error {
	t := c.s.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%s: %w (last: %v)", url, ctx.Err(), last)
	case <-exited:
		return errExitedBeforeReady
	case <-t.C():
		return nil
	}
}

// probeHeld is probe for a cell whose listeners the agent holds (listen.go):
// the port accepts from the start, so one request is sent, which waits in
// the listen backlog until a worker takes and answers it. Nothing polls
// while the cell starts. A request that fails early (a connection reset)
// is sent again after a pause, from 1ms growing to 20ms.
func (c *slot) probeHeld(ctx context.Context, exited <-chan struct{}, addr, url string) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-rctx.Done():
		}
	}()
	b := &backoff.Backoff{Initial: time.Millisecond, Max: 20 * time.Millisecond, Clock: c.s.clk}
	for {
		err := askReady(rctx, addr)
		if err == nil {
			return nil
		}
		if closed(exited) {
			return errExitedBeforeReady
		}
		if err := c.pause(ctx, exited, b.Next(), url, err); err != nil {
			return err
		}
	}
}

// readyPath is the cell's readiness path (the cells' Lua module answers it).
const readyPath = "/.cellvisor/ready"

// askReady asks the cell at addr once, in one HTTP/1.0 exchange on a fresh
// connection, until ctx ends: nil when a worker answered 200 (ready) or 503
// (drained, and up). Only the status line is read. A bare exchange rather
// than net/http's client, whose transport runs two goroutines for every
// connection: eight cells' probes at a start, and every cell's liveness
// check after, are that many connections.
func askReady(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := io.WriteString(conn, "GET "+readyPath+" HTTP/1.0\r\nHost: "+addr+"\r\n\r\n"); err != nil {
		return askErr(ctx, err)
	}
	line, err := bufio.NewReaderSize(conn, 256).ReadSlice('\n')
	if err != nil {
		return askErr(ctx, fmt.Errorf("readiness status line: %w", err))
	}
	proto, status, _ := strings.Cut(strings.TrimSpace(string(line)), " ")
	if !strings.HasPrefix(proto, "HTTP/1.") {
		return fmt.Errorf("readiness answered %q: not HTTP", strings.TrimSpace(string(line)))
	}
	code, _, _ := strings.Cut(status, " ")
	if code == "200" || code == "503" {
		return nil
	}
	return fmt.Errorf("readiness answered %s", status)
}

// askErr is err, or ctx's error where ctx ending caused it (the deadline
// its end set on the connection).
func askErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}
