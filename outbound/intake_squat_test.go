package outbound

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/testkit/testutil"
)

// slowForward opens a mutual-TLS connection to ed's intake from source
// with from's identity and sends a forward's headers announcing the
// largest bundle, then one byte of it: a body that dribbles.
func slowForward(t *testing.T, ctx context.Context, ed *edge, p *PeerTLS, source, class string) *tls.Conn {
	t.Helper()
	addr := ed.ln.Addr().String()
	d := tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}, Config: p.ClientConfig(ed.id)}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("slow forward from %s: %v", source, err)
	}
	c := nc.(*tls.Conn)
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", edgeapi.PathIntake, class, addr, edgeapi.MaxBundleBytes)
	return c
}

// Another org's edge (whose certificate the intake's TLS admits: every
// edge's is the control plane CA's) sends MaxIntakeInFlight forwards that
// dribble their bodies (issue 32 §2). Before, they held every in-flight
// slot and every forward of the org's peers was answered 503 (and went
// direct, bypassing the org's governed exit); now the peer's org is
// checked before a slot is taken, so they are refused at once and the
// org's peer is accepted.
func TestIntakeNotSquattedByAnotherOrg(t *testing.T) {
	e := newEnv(t, time.Minute)
	a := e.startEdge("edge-a", org, edgeOpts{})
	a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	b := e.startEdge("edge-b", org, edgeOpts{noIntake: true})
	b.awaitRoute(t, "metering", edgeapi.RouteProxy)
	x := e.startEdge("edge-x", "globex", edgeOpts{noIntake: true})
	x.awaitRoute(t, "metering", edgeapi.RouteDirect)
	px := peerTLS(t, x.identity)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range MaxIntakeInFlight {
		slowForward(t, ctx, a, px, fmt.Sprintf("127.0.0.%d", 2+i%8), "metering")
	}
	// The squatters have reached the handler: they hold every slot
	// (before), or they were refused (now).
	testutil.Eventually(t, 10*time.Second, func() error {
		if held, refused := len(a.in.inFlight), a.sender.IntakeCounts()[IntakePeerRefused]; held < MaxIntakeInFlight && refused < MaxIntakeInFlight {
			return fmt.Errorf("%d slots held, %d refused", held, refused)
		}
		return nil
	})
	bd, err := NewBundle(org, b.id, "metering", time.Now(), []Metering{{Cell: "cell-01", Requests: 1}})
	if err != nil {
		t.Fatal(err)
	}
	code, reason, err := postIntake(t, a, b.id, bd, peerTLS(t, b.identity))
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("the org's peer's forward while another org's edge dribbles %d forwards: %d %q %v, want 202", MaxIntakeInFlight, code, reason, err)
	}
}

// A peer of the org gets a fair share of the intake: at most one forward
// per class routed in flight (a sender has no more), the next one answered
// 429 at once while another peer is still accepted; and a body that
// dribbles is cut when the sender's own send timeout would have given up
// (408).
func TestIntakeFairSharePerPeer(t *testing.T) {
	e := newEnv(t, time.Minute)
	a := e.startEdge("edge-a", org, edgeOpts{})
	a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	b := e.startEdge("edge-b", org, edgeOpts{noIntake: true})
	b.awaitRoute(t, "metering", edgeapi.RouteProxy)
	c := e.startEdge("edge-c", org, edgeOpts{noIntake: true})
	c.awaitRoute(t, "metering", edgeapi.RouteProxy)
	pb := peerTLS(t, b.identity)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	perPeer := len(a.sender.o.Classes)
	var slow []*tls.Conn
	for i := range perPeer {
		slow = append(slow, slowForward(t, ctx, a, pb, fmt.Sprintf("127.0.0.%d", 2+i), "metering"))
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if n := a.in.peerInFlight("edge-b"); n < perPeer {
			return fmt.Errorf("edge-b has %d forwards in flight", n)
		}
		return nil
	})
	bundle := func(from *edge) edgeapi.Bundle {
		bd, err := NewBundle(org, from.id, "metering", time.Now(), []Metering{{Cell: "cell-01", Requests: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return bd
	}
	if code, reason, err := postIntake(t, a, b.id, bundle(b), pb); err != nil || code != http.StatusTooManyRequests {
		t.Errorf("edge-b's forward beyond its share: %d %q %v, want 429", code, reason, err)
	}
	if code, reason, err := postIntake(t, a, c.id, bundle(c), peerTLS(t, c.identity)); err != nil || code != http.StatusAccepted {
		t.Errorf("edge-c's forward while edge-b holds its share: %d %q %v, want 202", code, reason, err)
	}
	// The dribbling bodies are cut at the send timeout (3s here).
	for _, s := range slow {
		s.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufioReader(s), nil)
		if err != nil {
			t.Fatalf("a dribbling forward: %v, want 408", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("a dribbling forward answered %d, want 408", resp.StatusCode)
		}
	}
	if n := a.sender.IntakeCounts()[IntakeSlowBody]; n != int64(perPeer) {
		t.Errorf("%d forwards counted slow, want %d", n, perPeer)
	}
	if !strings.Contains(fmt.Sprint(a.sender.IntakeCounts()), IntakePeerBusy) {
		t.Errorf("intake counts %v lack %s", a.sender.IntakeCounts(), IntakePeerBusy)
	}
}

func bufioReader(c net.Conn) *bufio.Reader { return bufio.NewReader(c) }
