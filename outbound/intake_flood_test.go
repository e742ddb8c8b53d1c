package outbound

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/testkit/testutil"
)

// countingListener counts the connections taken from the kernel and not
// yet closed, in all and per source address, with their high-water marks:
// what the intake holds, seen from below whatever bounds it.
type countingListener struct {
	net.Listener
	mu             sync.Mutex // guards the following fields
	live, peak     int
	accepted       int
	byIP, peakByIP map[netip.Addr]int
}

func newCountingListener(ln net.Listener) *countingListener {
	return &countingListener{Listener: ln, byIP: map[netip.Addr]int{}, peakByIP: map[netip.Addr]int{}}
}

func (cl *countingListener) Accept() (net.Conn, error) {
	c, err := cl.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ip := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	cl.mu.Lock()
	cl.live++
	cl.accepted++
	cl.peak = max(cl.peak, cl.live)
	cl.byIP[ip]++
	cl.peakByIP[ip] = max(cl.peakByIP[ip], cl.byIP[ip])
	cl.mu.Unlock()
	return &countedConn{Conn: c, cl: cl, ip: ip}, nil
}

func (cl *countingListener) counts() (accepted, live, peak int, peakByIP map[netip.Addr]int) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	out := make(map[netip.Addr]int, len(cl.peakByIP))
	for k, v := range cl.peakByIP {
		out[k] = v
	}
	return cl.accepted, cl.live, cl.peak, out
}

type countedConn struct {
	net.Conn
	cl   *countingListener
	ip   netip.Addr
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.cl.mu.Lock()
		c.cl.live--
		c.cl.byIP[c.ip]--
		c.cl.mu.Unlock()
	})
	return c.Conn.Close()
}

// flood opens n TCP connections to addr from the loopback sources given,
// round robin, that never send a byte (never a ClientHello), and holds
// them open until the test ends. A connection the server closes stays
// open on this side; nothing reads it.
func flood(t *testing.T, ctx context.Context, addr string, n int, sources []string) {
	t.Helper()
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(sources[i%len(sources)])}}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			t.Fatalf("flood connection %d of %d: %v", i+1, n, err)
		}
		conns = append(conns, c)
	}
}

// An unauthenticated TCP flood (issue 32 §1): 3,000 connections that never
// send a ClientHello, from eight loopback addresses, held open. The intake
// holds at most its caps of them (in all and per address), its goroutines
// stay bounded, and a peer's forward still gets through while the flood
// is held open.
func TestIntakeFloodIsBounded(t *testing.T) {
	const (
		n        = 3000
		maxConns = 64
		perIP    = 4 // eight addresses: 32, the pending cap
	)
	e := newEnv(t, time.Minute)
	var cl *countingListener
	a := e.startEdge("edge-a", org, edgeOpts{maxConns: maxConns, maxConnsPerIP: perIP, handshake: 10 * time.Second,
		wrap: func(ln net.Listener) net.Listener { cl = newCountingListener(ln); return cl }})
	a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	b := e.startEdge("edge-b", org, edgeOpts{noIntake: true})
	b.awaitRoute(t, "metering", edgeapi.RouteProxy)
	p := peerTLS(t, b.identity)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	g0 := runtime.NumGoroutine()
	var sources []string
	for i := 2; i <= 9; i++ {
		sources = append(sources, fmt.Sprintf("127.0.0.%d", i))
	}
	flood(t, ctx, a.ln.Addr().String(), n, sources)
	// The intake has taken (and dropped or refused) what the kernel queued
	// once it has seen them all.
	testutil.Eventually(t, 30*time.Second, func() error {
		if accepted, _, _, _ := cl.counts(); accepted < n {
			return fmt.Errorf("the intake took %d of the %d connections", accepted, n)
		}
		return nil
	})
	// A peer's forward gets through while the flood is held open.
	bd, err := NewBundle(org, b.id, "metering", time.Now(), []Metering{{Cell: "cell-01", Requests: 1}})
	if err != nil {
		t.Fatal(err)
	}
	code, reason, err := postIntake(t, a, b.id, bd, p)
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("forward during the flood: %d %q %v, want 202", code, reason, err)
	}
	g1 := runtime.NumGoroutine()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	heap := int64(m1.HeapInuse) - int64(m0.HeapInuse)
	_, live, peak, peakByIP := cl.counts()
	t.Logf("flood of %d: intake holds %d connections (peak %d), goroutines %d -> %d, heap in use %+d KiB", n, live, peak, g0, g1, heap>>10)
	// The one connection being decided on is taken before the oldest
	// pending one makes room for it: hence the +1.
	if peak > maxConns+1 {
		t.Errorf("the intake held %d connections at once, over its cap of %d", peak, maxConns)
	}
	for ip, pk := range peakByIP {
		if pk > perIP+1 {
			t.Errorf("the intake held %d connections of %s at once, over its cap of %d per address", pk, ip, perIP)
		}
	}
	if d := g1 - g0; d > maxConns+50 {
		t.Errorf("goroutines grew by %d under the flood: want at most the cap (%d) and a few", d, maxConns)
	}
	// This process holds the flood's client ends too (about 1 KiB each);
	// the intake's own share is bounded by its cap.
	if limit := int64(n)*2<<10 + maxConns*64<<10; heap > limit {
		t.Errorf("heap in use grew by %d KiB under the flood: want at most %d KiB", heap>>10, limit>>10)
	}
}
