package acmeissue

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"cellvisor/internal/clock"
	"cellvisor/internal/pebbletest"
)

// certStore is a Source and Sink over one domain, reading what it stores
// as the control API's store would: the leaf's names and validity, the
// latter moved onto the fake clock (Pebble dates its certificates by the
// real one, which the test does not move).
type certStore struct {
	clk   clock.Clock
	mu    sync.Mutex
	dom   Domain
	certs []*x509.Certificate
}

func (c *certStore) ACMEDomains(context.Context) ([]Domain, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return []Domain{c.dom}, nil
}

func (c *certStore) Put(_ context.Context, name string, cert *Certificate) error {
	pair, err := tls.X509KeyPair(cert.ChainPEM, cert.KeyPEM)
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	c.dom.NotBefore, c.dom.NotAfter, c.dom.Covered = now, now.Add(leaf.NotAfter.Sub(leaf.NotBefore)), leaf.DNSNames
	c.certs = append(c.certs, leaf)
	return nil
}

func (c *certStore) stored() []*x509.Certificate {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*x509.Certificate(nil), c.certs...)
}

// TestSchedulerRenewsAgainstPebble runs the schedule on a fake clock that
// starts at the real time, against a real Pebble: the first certificate at
// once, the renewal when the fake time reaches two thirds of the real
// certificate's lifetime.
func TestSchedulerRenewsAgainstPebble(t *testing.T) {
	hosts := []string{"renew.example.com"}
	r := newResponder(t)
	ca := pebbletest.Start(t, pebbletest.Options{HTTPPort: r.port, Hostnames: hosts, Validity: 6 * 24 * time.Hour})
	is := newIssuer(t, ca, &memKeys{}, r, nil)
	clk := clock.NewFake(time.Now())
	store := &certStore{clk: clk, dom: Domain{Name: "renew", Hostnames: hosts}}
	s, err := NewScheduler(SchedulerOptions{Source: store, Sink: store, Obtainer: is, Clock: clk, Rand: func() float64 { return 0.5 }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	settle := func() {
		t.Helper()
		wctx, wcancel := context.WithTimeout(context.Background(), testTimeout)
		defer wcancel()
		if err := clk.AwaitWaiters(wctx, 1); err != nil {
			t.Fatalf("the scheduler did not arm its timer: %v\npebble:\n%s", err, ca.Output())
		}
	}

	settle()
	certs := store.stored()
	if len(certs) != 1 {
		t.Fatalf("%d certificates stored, want the first at once; status %+v", len(certs), s.Status())
	}
	first := certs[0]
	life := first.NotAfter.Sub(first.NotBefore)
	if life < 6*24*time.Hour-time.Minute || life > 6*24*time.Hour {
		t.Fatalf("lifetime %v, want the 6 days Pebble was told", life)
	}
	// Two thirds of the lifetime after it began: by the store's account
	// (on the fake clock) or the leaf's (real), whichever ends later, as
	// the scheduler trusts the later of the two.
	store.mu.Lock()
	began, ends := store.dom.NotBefore, store.dom.NotAfter
	store.mu.Unlock()
	if first.NotAfter.After(ends) {
		began = first.NotBefore
	}
	renewAt := began.Add(life * 2 / 3)
	// Just after the certificate was stored the status may still give the
	// leaf's account, set as it was stored, until the scheduler has looked
	// at the store's again: either, and the timer fires by the later.
	leafAt := first.NotBefore.Add(life * 2 / 3)
	if st := s.Status(); len(st) != 1 || !st[0].NextAttempt.Equal(renewAt) && !st[0].NextAttempt.Equal(leafAt) {
		t.Fatalf("status %+v, want the renewal at %v (or the leaf's %v)", st, renewAt, leafAt)
	}
	if leafAt.After(renewAt) {
		renewAt = leafAt
	}
	clk.Advance(renewAt.Sub(clk.Now()) - time.Second)
	settle()
	if n := len(store.stored()); n != 1 {
		t.Fatalf("%d certificates stored a second before two thirds of the lifetime", n)
	}
	clk.Advance(time.Second)
	settle()
	certs = store.stored()
	if len(certs) != 2 {
		t.Fatalf("%d certificates stored after two thirds of the lifetime, want the renewal; status %+v", len(certs), s.Status())
	}
	if certs[1].SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatalf("the renewal is not a new certificate: serial %v twice", first.SerialNumber)
	}
	if got, _, _, _ := r.counts(); got != 2 {
		t.Errorf("challenges presented %d times, want once per order", got)
	}
}
