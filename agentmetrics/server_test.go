package agentmetrics

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"cellvisor/testkit/testutil"
)

// A flood of connections that never send a request (issue 32 §1) holds at
// most the endpoint's cap, and a scrape still gets through while it is
// held open.
func TestServerBoundsAFlood(t *testing.T) {
	const n, maxConns = 1000, 8
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up 1\n") })
	s := NewServer("127.0.0.1:0", h, Limits{MaxConns: maxConns, HandshakeTimeout: time.Minute}, zaptest.NewLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	var addr string
	testutil.Eventually(t, 10*time.Second, func() error {
		var err error
		if addr, err = s.Addr(); addr == "" {
			return fmt.Errorf("not bound: %v", err)
		}
		return nil
	})
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	defer dcancel()
	g0 := runtime.NumGoroutine()
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%8))}}
		c, err := d.DialContext(dctx, "tcp", addr)
		if err != nil {
			t.Fatalf("flood connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if st := s.ConnStats(); st.Accepted < n {
			return fmt.Errorf("%d of %d taken", st.Accepted, n)
		}
		return nil
	})
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape during the flood: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "up 1\n" {
		t.Fatalf("scrape during the flood: %d %q", resp.StatusCode, body)
	}
	st := s.ConnStats()
	t.Logf("after a flood of %d: %+v, goroutines %d -> %d", n, st, g0, runtime.NumGoroutine())
	if st.Open > maxConns || st.Pending > maxConns/2 {
		t.Errorf("stats %+v: over the cap %d (half of it pending)", st, maxConns)
	}
	if d := runtime.NumGoroutine() - g0; d > maxConns+10 {
		t.Errorf("goroutines grew by %d under the flood, want at most the cap %d and a few", d, maxConns)
	}
}
