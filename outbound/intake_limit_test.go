package outbound

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"cellvisor/edgeapi"
)

// Forwards that send their headers and then dribble a bundle of the
// largest size hold the intake only up to MaxIntakeInFlight: the next one
// is answered 503 before its body is read (a sender delivers it itself),
// so that peers cannot make the agent hold more than that many bundles in
// memory. Once they are gone a forward is taken again. Each peer holds at
// most its share (TestIntakeFairSharePerPeer), so the slots are filled by
// as many peers of the org as it takes.
func TestIntakeBoundsForwardsInFlight(t *testing.T) {
	// Every connection comes from 127.0.0.1: lift the cap per address.
	e := newEnv(t, time.Minute)
	a := e.startEdge("edge-a", org, edgeOpts{maxConnsPerIP: 64})
	a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	b := e.startEdge("edge-b", org, edgeOpts{noIntake: true})
	b.awaitRoute(t, "metering", edgeapi.RouteProxy)
	p := peerTLS(t, b.identity)
	addr := strings.TrimPrefix(a.intake, "https://")
	var slow []*tls.Conn
	closeSlow := func() {
		for _, c := range slow {
			c.Close()
		}
		slow = nil
	}
	t.Cleanup(closeSlow)
	share := a.in.perPeer()
	for i := range MaxIntakeInFlight / share {
		sq := e.startEdge(fmt.Sprintf("edge-s%02d", i), org, edgeOpts{noIntake: true})
		ps := peerTLS(t, sq.identity)
		for range share {
			c, err := tls.Dial("tcp", addr, ps.ClientConfig(a.id))
			if err != nil {
				t.Fatal(err)
			}
			slow = append(slow, c)
			fmt.Fprintf(c, "POST %smetering HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", edgeapi.PathIntake, addr, edgeapi.MaxBundleBytes)
		}
	}
	bundle := func() edgeapi.Bundle {
		bd, err := NewBundle(org, b.id, "metering", time.Now(), []Metering{{Cell: "cell-01", Requests: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return bd
	}
	// The slow ones reach the handler in their own time (slow on a busy
	// machine: 16 TLS handshakes): ask until the intake says it is busy.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		code, reason, err := postIntake(t, a, b.id, bundle(), p)
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusServiceUnavailable {
			if !strings.Contains(reason, "busy") {
				t.Fatalf("503 %q: want the intake busy", reason)
			}
			break
		}
		if pause(ctx) != nil {
			t.Fatalf("with %d forwards dribbling their bodies the intake still answers %d (%s): want 503", MaxIntakeInFlight, code, reason)
		}
	}
	closeSlow()
	for {
		code, reason, err := postIntake(t, a, b.id, bundle(), p)
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusAccepted {
			break
		}
		if pause(ctx) != nil {
			t.Fatalf("after the slow forwards went away the intake answers %d (%s): want 202", code, reason)
		}
	}
}

// pause waits a little before asking again, or answers ctx's end.
func pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Millisecond):
		return nil
	}
}
