package systemd

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"cellvisor/internal/clock"
)

// notifySocket is systemd's end of NOTIFY_SOCKET: a unixgram socket that
// records every datagram.
type notifySocket struct {
	mu  sync.Mutex // guards got
	got []string
	arr chan struct{} // one value per datagram
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifySocket{arr: make(chan struct{}, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.got = append(n.got, string(buf[:k]))
			n.mu.Unlock()
			n.arr <- struct{}{}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	t.Setenv("NOTIFY_SOCKET", path)
	return n
}

func (n *notifySocket) messages() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.got...)
}

// awaitCount waits until k datagrams arrived, bounded by ctx.
func (n *notifySocket) awaitCount(ctx context.Context, t *testing.T, k int) {
	t.Helper()
	for len(n.messages()) < k {
		select {
		case <-n.arr:
		case <-ctx.Done():
			t.Fatalf("%d datagram(s) arrived, want %d: %q", len(n.messages()), k, n.messages())
		}
	}
}

// The watchdog pings through the real NOTIFY_SOCKET at half WATCHDOG_USEC
// while the health check passes, sends nothing while it fails, logs the
// reason once and the recovery once.
func TestWatchdogPingsOnlyWhileHealthy(t *testing.T) {
	sock := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", "2000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	core, logs := observer.New(zapcore.InfoLevel)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	n := New(zap.New(core))
	n.clk = clk

	stale := errors.New("activation for 14m0s (bound 13m30s)")
	results := []error{nil, stale, stale, stale, nil}
	calls := make(chan int)
	var call int
	check := func() error {
		i := call
		call++
		calls <- i
		return results[i]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); n.Watchdog(wctx, check) }()
	t.Cleanup(func() { stop(); <-done })
	if err := clk.AwaitWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}

	pings := 0
	for i, want := range results {
		clk.Advance(time.Second) // half of WATCHDOG_USEC: one tick
		select {
		case got := <-calls:
			if got != i {
				t.Fatalf("check call %d, want %d", got, i)
			}
		case <-ctx.Done():
			t.Fatalf("tick %d: no health check", i)
		}
		if want == nil {
			pings++
			sock.awaitCount(ctx, t, pings)
		}
	}
	// The last check passed and its ping arrived; the failing ones, which
	// came before it on the same socket, sent nothing.
	stop()
	<-done
	msgs := sock.messages()
	if len(msgs) != 2 || msgs[0] != "WATCHDOG=1" || msgs[1] != "WATCHDOG=1" {
		t.Errorf("datagrams %q, want two WATCHDOG=1 (ticks 0 and 4, none for the 3 failing checks)", msgs)
	}
	if got := logs.FilterMessageSnippet("not pinging").Len(); got != 1 {
		t.Errorf("%d 'not pinging' log lines, want 1 for the whole failing stretch", got)
	} else if e := logs.FilterMessageSnippet("not pinging").All()[0]; e.ContextMap()["error"] != stale.Error() {
		t.Errorf("logged reason %v, want %q", e.ContextMap()["error"], stale)
	}
	if got := logs.FilterMessageSnippet("healthy again").Len(); got != 1 {
		t.Errorf("%d recovery log lines, want 1", got)
	}
}

// Without WATCHDOG_USEC (no WatchdogSec=, or not under systemd) Watchdog
// returns at once and never asks for health.
func TestWatchdogOffWithoutWatchdogUSEC(t *testing.T) {
	sock := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", "")
	n := New(nil)
	n.clk = clock.NewFake(time.Unix(1_700_000_000, 0))
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Watchdog(context.Background(), func() error { t.Error("health checked without a watchdog"); return nil })
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Watchdog did not return without WATCHDOG_USEC")
	}
	if msgs := sock.messages(); len(msgs) != 0 {
		t.Errorf("datagrams %q, want none", msgs)
	}
}
