package outbound

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/internal/clock"
)

// clockedControl is a control API whose answers take time on a fake clock.
type clockedControl struct {
	clk   *clock.Fake
	elect edgeapi.ElectResponse
	// fenceTook is how long each fence's answer takes; fenceErr its answer.
	fenceTook time.Duration
	fenceErr  error
	fences    int
}

func (c *clockedControl) Elect(context.Context, edgeapi.ElectRequest) (edgeapi.ElectResponse, error) {
	return c.elect, nil
}

func (c *clockedControl) Fence(context.Context, edgeapi.FenceRequest) error {
	c.fences++
	c.clk.Advance(c.fenceTook)
	return c.fenceErr
}

// clockedSender is a Sender for edge-a on clk, its metering route direct
// under a lease of a minute at epoch 7 that it holds (renewed every 20s).
func clockedSender(t *testing.T, clk *clock.Fake) (*Sender, *clockedControl) {
	t.Helper()
	ctl := &clockedControl{clk: clk, elect: edgeapi.ElectResponse{Outcome: edgeapi.OutcomeElected, Renew: 20 * time.Second,
		Holder: &edgeapi.Holder{EdgeID: "edge-a", Epoch: 7, ExpiresAt: clk.Now().Add(time.Minute)}}}
	j, err := OpenJournal(context.Background(), t.TempDir(), 10, edgeapi.MaxBundleBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSender(Options{EdgeID: "edge-a", Org: org, Control: ctl, Journal: j, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.elect(context.Background(), "metering"); err != nil {
		t.Fatal(err)
	}
	return s, ctl
}

// The sender tells time by its clock, not the wall's (issue 33): a fence
// answered later than half the renewal cadence after it was asked, on that
// clock, is not sent under; one answered in time is.
func TestFenceFreshnessIsOnTheSendersClock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		took   time.Duration
		fences int
		ok     bool
	}{
		{"answered in a second", time.Second, 1, true},
		{"answered at half the cadence", 10 * time.Second, 1, true},
		{"answered past half the cadence", 11 * time.Second, maxFences, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			s, ctl := clockedSender(t, clk)
			ctl.fenceTook = tc.took
			rt, _ := s.holderRoute("metering")
			err := s.fence(context.Background(), rt, edgeapi.Bundle{ID: "b1", Class: "metering"})
			if (err == nil) != tc.ok || ctl.fences != tc.fences {
				t.Errorf("fence: %v after %d asks, want ok %v after %d", err, ctl.fences, tc.ok, tc.fences)
			}
		})
	}
}

// The lease's expiry in status is judged on the sender's clock.
func TestStatusExpiresTheLeaseOnTheSendersClock(t *testing.T) {
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, _ := clockedSender(t, clk)
	route := func() edgeapi.RouteStatus {
		for _, r := range s.Status().Routes {
			if r.Class == "metering" {
				return r
			}
		}
		t.Fatal("no metering route")
		return edgeapi.RouteStatus{}
	}
	if r := route(); r.Route != edgeapi.RouteDirect || r.Epoch != 7 {
		t.Fatalf("route %+v, want direct at epoch 7 before the lease's expiry", r)
	}
	clk.Advance(time.Minute)
	if r := route(); r.Route != edgeapi.RouteUnknown || !strings.Contains(r.Reason, "lease expired") {
		t.Errorf("route %+v, want unknown once the lease expired", r)
	}
}

// A refused fence asks for an election and still says why: the caller can
// tell a stale lease (ErrStale) from the election it asks for.
func TestStaleFenceKeepsItsCause(t *testing.T) {
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s, ctl := clockedSender(t, clk)
	ctl.fenceErr = fmt.Errorf("fence metering: %w", ErrStale)
	rt, _ := s.holderRoute("metering")
	err := s.fence(context.Background(), rt, edgeapi.Bundle{ID: "b1", Class: "metering"})
	if !errors.Is(err, errReelect) || !errors.Is(err, ErrStale) {
		t.Errorf("fence: %v; want it to wrap both errReelect and ErrStale", err)
	}
}
