package controlapi_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// A flood of connections that never send a ClientHello against the
// edge-control listener (issue 32 §1: 5,000 of them cost the control API
// 51 MB, and nothing bounded them) holds at most its caps, and an enrolled
// edge still polls, and a new one enrolls, while it is held open.
func TestEdgeListenerFloodIsBounded(t *testing.T) {
	const n, maxConns, maxPending, perIP = 3000, 200, 100, 20
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	_, _, dir := e.enroll(t, e.createEdge(t, "before").Token)

	// A second edge-control listener on the same replica, with small caps.
	hs := httptest.NewUnstartedServer(e.srv.EdgeHandler())
	ln, tc, err := e.srv.ListenEdge(hs.Listener, controlapi.ListenLimits{MaxConns: maxConns, MaxPending: maxPending, MaxConnsPerIP: perIP,
		HandshakeTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	hs.Listener, hs.Config.TLSConfig, hs.Config.ConnState = ln, tc, ln.ConnState
	hs.Start()
	t.Cleanup(hs.Close)
	addr := ln.Addr().String()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runtime.GC()
	g0 := runtime.NumGoroutine()
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%8))}}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			t.Fatalf("flood connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if st := ln.Stats(); st.Accepted < n {
			return fmt.Errorf("%d of %d taken", st.Accepted, n)
		}
		return nil
	})
	flooded := *e
	flooded.edgeURL = "https://" + addr
	c := flooded.client(t, dir)
	if _, err := c.Page(ctx, 0, ""); err != nil && !errors.Is(err, manifest.ErrNoChange) {
		t.Fatalf("an enrolled edge's poll during the flood: %v", err)
	}
	if _, _, _ = flooded.enroll(t, e.createEdge(t, "during").Token); t.Failed() {
		return
	}
	st := ln.Stats()
	g1 := runtime.NumGoroutine()
	t.Logf("after a flood of %d: %+v; goroutines %d -> %d", n, st, g0, g1)
	if st.Open > maxConns || st.Pending > 8*perIP || st.Pending > maxPending {
		t.Errorf("stats %+v: over the caps (%d, %d pending, %d per address)", st, maxConns, maxPending, perIP)
	}
	if d := g1 - g0; d > maxConns+50 {
		t.Errorf("goroutines grew by %d under the flood, want at most the cap %d and a few", d, maxConns)
	}
	if resp, err := http.Get("http://" + addr); err == nil {
		resp.Body.Close()
		t.Errorf("plain HTTP to the edge listener answered %d, want the TLS handshake to fail", resp.StatusCode)
	}
}
