package acmeissue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/internal/clock"
)

// fakeCA stands for the Source, the Sink and the Obtainer at once: the
// domains, what was stored for them, and orders that fail while fail says
// so, each recorded with the fake time it started at.
type fakeCA struct {
	clk *clock.Fake
	// lag, when set, keeps Put from showing in ACMEDomains (a store
	// that lags behind).
	lag bool

	mu       sync.Mutex
	doms     map[string]Domain
	fail     func(n int) error // n: the order's number, from 1
	orders   []time.Time
	lifetime time.Duration
}

func (f *fakeCA) ACMEDomains(context.Context) ([]Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Domain
	for _, d := range f.doms {
		out = append(out, d)
	}
	return out, nil
}

func (f *fakeCA) Put(_ context.Context, name string, c *Certificate) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lag {
		return nil
	}
	d := f.doms[name]
	d.NotBefore, d.NotAfter, d.Covered = c.NotBefore, c.NotAfter, d.Hostnames
	f.doms[name] = d
	return nil
}

func (f *fakeCA) Obtain(_ context.Context, _ string, _ []string) (*Certificate, error) {
	now := f.clk.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.orders = append(f.orders, now)
	if f.fail != nil {
		if err := f.fail(len(f.orders)); err != nil {
			return nil, err
		}
	}
	return &Certificate{ChainPEM: []byte("chain"), KeyPEM: []byte("key"), NotBefore: now, NotAfter: now.Add(f.lifetime)}, nil
}

func (f *fakeCA) orderTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.orders...)
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// startScheduler runs a Scheduler on a fake clock until the test ends, and
// returns a function that advances the clock by d and waits until the
// Scheduler has done its step and armed its next timer.
func startScheduler(t *testing.T, f *fakeCA, obt Obtainer, opts ...func(*SchedulerOptions)) (*Scheduler, func(d time.Duration)) {
	t.Helper()
	o := SchedulerOptions{Source: f, Sink: f, Obtainer: obt, Clock: f.clk, Rand: func() float64 { return 0.5 }}
	for _, set := range opts {
		set(&o)
	}
	s, err := NewScheduler(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
	settle := func() {
		t.Helper()
		wctx, wcancel := context.WithTimeout(context.Background(), testTimeout)
		defer wcancel()
		if err := f.clk.AwaitWaiters(wctx, 1); err != nil {
			t.Fatalf("the scheduler did not arm its timer: %v", err)
		}
	}
	settle()
	return s, func(d time.Duration) {
		t.Helper()
		f.clk.Advance(d)
		settle()
	}
}

func state(t *testing.T, s *Scheduler, name string) State {
	t.Helper()
	for _, st := range s.Status() {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("no state for %s in %+v", name, s.Status())
	return State{}
}

func TestSchedulerObtainsThenRenewsAtTwoThirds(t *testing.T) {
	f := &fakeCA{clk: clock.NewFake(t0), lifetime: 90 * 24 * time.Hour,
		doms: map[string]Domain{"shop": {Name: "shop", Hostnames: []string{"shop.example.com"}}}}
	s, advance := startScheduler(t, f, f)

	if got := f.orderTimes(); len(got) != 1 || !got[0].Equal(t0) {
		t.Fatalf("orders %v, want one at once (no certificate)", got)
	}
	renew := t0.Add(60 * 24 * time.Hour)
	if st := state(t, s, "shop"); !st.NextAttempt.Equal(renew) || !st.LastSuccess.Equal(t0) || st.Failures != 0 {
		t.Fatalf("state %+v, want next attempt at two thirds (%v)", st, renew)
	}
	advance(60*24*time.Hour - time.Second)
	if got := f.orderTimes(); len(got) != 1 {
		t.Fatalf("orders %v: renewed before two thirds of the lifetime", got)
	}
	advance(time.Second)
	if got := f.orderTimes(); len(got) != 2 || !got[1].Equal(renew) {
		t.Fatalf("orders %v, want the renewal at %v", got, renew)
	}
	if st := state(t, s, "shop"); !st.NextAttempt.Equal(renew.Add(60 * 24 * time.Hour)) {
		t.Fatalf("after renewal next attempt %v", st.NextAttempt)
	}
}

func TestSchedulerBacksOffAndReportsTheProblem(t *testing.T) {
	const failures = 11
	problem := &Error{Step: "validate", Hostname: "shop.example.com", Problems: []Problem{{
		Type: "urn:ietf:params:acme:error:unauthorized", Detail: "The key authorization file from the server did not match"}}}
	f := &fakeCA{clk: clock.NewFake(t0), lifetime: 90 * 24 * time.Hour,
		doms: map[string]Domain{"shop": {Name: "shop", Hostnames: []string{"shop.example.com"}}},
		fail: func(n int) error {
			if n <= failures {
				return fmt.Errorf("acme order for shop: %w", problem)
			}
			return nil
		}}
	s, advance := startScheduler(t, f, f)

	// Doubling from 1 minute; at the 6 h cap the jitter (here its middle)
	// spreads over [3 h, 6 h], and a delay never passes the cap.
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 244, 270, 270}
	for i, d := range want {
		d *= time.Minute
		st := state(t, s, "shop")
		if st.Failures != i+1 || !strings.Contains(st.LastError, "unauthorized") || len(st.Problems) != 1 ||
			st.Problems[0].Type != "urn:ietf:params:acme:error:unauthorized" {
			t.Fatalf("after failure %d: state %+v", i+1, st)
		}
		if got := st.NextAttempt.Sub(st.LastAttempt); got != d {
			t.Fatalf("after failure %d: retry in %v, want %v", i+1, got, d)
		}
		n := len(f.orderTimes())
		advance(d - time.Second)
		if got := len(f.orderTimes()); got != n {
			t.Fatalf("after failure %d: retried %v early", i+1, time.Second)
		}
		advance(time.Second)
		if got := len(f.orderTimes()); got != n+1 {
			t.Fatalf("after failure %d: no retry at %v (orders %d)", i+1, d, got)
		}
	}
	st := state(t, s, "shop")
	if st.Failures != 0 || st.LastError != "" || st.Problems != nil || st.LastSuccess.IsZero() {
		t.Fatalf("after the success: state %+v, want the failures cleared", st)
	}
	if got := st.NextAttempt.Sub(st.LastSuccess); got != 60*24*time.Hour {
		t.Fatalf("after the success: next attempt in %v, want two thirds of 90 days", got)
	}
}

func TestSchedulerLaggingStoreAndNewHostname(t *testing.T) {
	f := &fakeCA{clk: clock.NewFake(t0), lifetime: 90 * 24 * time.Hour, lag: true,
		doms: map[string]Domain{"shop": {Name: "shop", Hostnames: []string{"shop.example.com"}}}}
	s, advance := startScheduler(t, f, f)
	advance(time.Hour) // many rescans: the store still shows no certificate
	if got := f.orderTimes(); len(got) != 1 {
		t.Fatalf("orders %v: a store that lags made the scheduler order again", got)
	}
	// A hostname added to the domain makes it due at once.
	f.mu.Lock()
	f.doms["shop"] = Domain{Name: "shop", Hostnames: []string{"shop.example.com", "www.shop.example.com"}}
	f.mu.Unlock()
	advance(time.Minute)
	if got := f.orderTimes(); len(got) != 2 {
		t.Fatalf("orders %v: a new hostname did not start an order", got)
	}
	// A domain no longer asking for ACME is forgotten.
	f.mu.Lock()
	delete(f.doms, "shop")
	f.mu.Unlock()
	advance(time.Minute)
	if st := s.Status(); len(st) != 0 {
		t.Fatalf("status %+v, want the removed domain gone", st)
	}
}

func TestRenewAt(t *testing.T) {
	nb := t0.Add(-30 * 24 * time.Hour)
	na := nb.Add(90 * 24 * time.Hour)
	hosts := []string{"a.example.com", "b.example.com"}
	for _, tc := range []struct {
		name string
		d    Domain
		want time.Time
	}{
		{"no certificate", Domain{Hostnames: hosts}, t0},
		{"two thirds", Domain{Hostnames: hosts, Covered: hosts, NotBefore: nb, NotAfter: na}, nb.Add(60 * 24 * time.Hour)},
		{"wildcard covers one label", Domain{Hostnames: hosts, Covered: []string{"*.example.com"}, NotBefore: nb, NotAfter: na}, nb.Add(60 * 24 * time.Hour)},
		{"wildcard covers no deeper", Domain{Hostnames: []string{"x.a.example.com"}, Covered: []string{"*.example.com"}, NotBefore: nb, NotAfter: na}, t0},
		{"a hostname not covered", Domain{Hostnames: hosts, Covered: hosts[:1], NotBefore: nb, NotAfter: na}, t0},
		{"ended", Domain{Hostnames: hosts, Covered: hosts, NotBefore: nb, NotAfter: t0}, t0},
		{"past two thirds", Domain{Hostnames: hosts, Covered: hosts, NotBefore: nb.Add(-40 * 24 * time.Hour), NotAfter: na.Add(-40 * 24 * time.Hour)}, t0.Add(-10 * 24 * time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RenewAt(t0, tc.d); !got.Equal(tc.want) {
				t.Fatalf("RenewAt = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSchedulerOrdersOnlyWhileLeading(t *testing.T) {
	f := &fakeCA{clk: clock.NewFake(t0), lifetime: 90 * 24 * time.Hour,
		doms: map[string]Domain{"shop": {Name: "shop", Hostnames: []string{"shop.example.com"}}}}
	var mu sync.Mutex
	leading := false
	s, advance := startScheduler(t, f, f, func(o *SchedulerOptions) {
		o.Leader = func(context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return leading, nil
		}
	})
	advance(time.Hour)
	if got := f.orderTimes(); len(got) != 0 || len(s.Status()) != 0 {
		t.Fatalf("orders %v, status %+v: a replica not leading ordered or reported", got, s.Status())
	}
	mu.Lock()
	leading = true
	mu.Unlock()
	advance(time.Minute)
	if got := f.orderTimes(); len(got) != 1 || !got[0].Equal(t0.Add(time.Hour+time.Minute)) {
		t.Fatalf("orders %v, want one at the first step as leader", got)
	}
}
