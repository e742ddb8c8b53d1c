package store

import (
	"errors"
	"sync"
	"testing"
	"time"
)

var leaseT0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// TestLeaseRace: 50 edges acquiring one scope at once yield exactly one
// holder; the others lose on the partial unique index.
func TestLeaseRace(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		c := ctx(t)
		const n = 50
		var wg sync.WaitGroup
		won := make(chan Lease, n)
		errs := make(chan error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				l, err := s.AcquireLease(c, "acme", "metering", "edge-"+string(rune('A'+i)), leaseT0, 2*time.Minute, nil)
				if err != nil {
					errs <- err
					return
				}
				won <- l
			}()
		}
		close(start)
		wg.Wait()
		close(won)
		close(errs)
		var winners []Lease
		for l := range won {
			winners = append(winners, l)
		}
		if len(winners) != 1 {
			t.Fatalf("%d winners, want exactly 1: %+v", len(winners), winners)
		}
		lost := 0
		for err := range errs {
			if !errors.Is(err, ErrLeaseHeld) {
				t.Fatalf("a loser's error is not ErrLeaseHeld: %v", err)
			}
			lost++
		}
		if lost != n-1 {
			t.Fatalf("%d lost, want %d", lost, n-1)
		}
		got, err := s.ActiveLease(c, "acme", "metering")
		if err != nil || got.Holder != winners[0].Holder || got.Epoch != winners[0].Epoch {
			t.Fatalf("active lease %+v, %v; want the winner's %+v", got, err, winners[0])
		}
		// Another class of the same org is its own scope.
		if _, err := s.AcquireLease(c, "acme", "license", "edge-B", leaseT0, time.Minute, nil); err != nil {
			t.Fatalf("another class: %v", err)
		}
	})
}

// TestLeaseLifecycle: renew by the holder at its epoch only, expiry then
// acquire elects a successor with a higher epoch, a frozen holder cannot
// renew past expiry, takeover supersedes, and epochs grow after release and
// pruning.
func TestLeaseLifecycle(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		c := ctx(t)
		ttl := 2 * time.Second
		a, err := s.AcquireLease(c, "acme", "metering", "a", leaseT0, ttl, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.AcquireLease(c, "acme", "metering", "b", leaseT0.Add(time.Second), ttl, nil); !errors.Is(err, ErrLeaseHeld) {
			t.Fatalf("acquire over a current lease: %v, want ErrLeaseHeld", err)
		}
		if _, err := s.RenewLease(c, "acme", "metering", "b", a.Epoch, leaseT0.Add(time.Second), ttl); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("renew by a non-holder: %v, want ErrLeaseLost", err)
		}
		if _, err := s.RenewLease(c, "acme", "metering", "a", a.Epoch+1, leaseT0.Add(time.Second), ttl); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("renew at a wrong epoch: %v, want ErrLeaseLost", err)
		}
		r, err := s.RenewLease(c, "acme", "metering", "a", a.Epoch, leaseT0.Add(time.Second), ttl)
		if err != nil || !r.ExpiresAt.Equal(leaseT0.Add(3*time.Second)) || r.Epoch != a.Epoch {
			t.Fatalf("renew: %+v, %v; want expiry at t0+3s, epoch %d", r, err, a.Epoch)
		}
		// The holder freezes past its lease: a successor acquires.
		late := leaseT0.Add(3 * time.Second)
		b, err := s.AcquireLease(c, "acme", "metering", "b", late, ttl, nil)
		if err != nil {
			t.Fatalf("acquire after expiry: %v", err)
		}
		if b.Epoch <= a.Epoch {
			t.Fatalf("successor epoch %d, not above %d", b.Epoch, a.Epoch)
		}
		// The frozen holder resumes: it cannot renew its old epoch.
		if _, err := s.RenewLease(c, "acme", "metering", "a", a.Epoch, late, ttl); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("renew after being succeeded: %v, want ErrLeaseLost", err)
		}
		// A takeover names the lease it ends; a wrong epoch ends nothing.
		if _, err := s.AcquireLease(c, "acme", "metering", "c", late, ttl, &Superseded{Holder: "b", Epoch: b.Epoch - 1}); !errors.Is(err, ErrLeaseHeld) {
			t.Fatalf("takeover at a stale epoch: %v, want ErrLeaseHeld", err)
		}
		cl, err := s.AcquireLease(c, "acme", "metering", "c", late, ttl, &Superseded{Holder: "b", Epoch: b.Epoch})
		if err != nil || cl.Epoch <= b.Epoch {
			t.Fatalf("takeover: %+v, %v; want an epoch above %d", cl, err, b.Epoch)
		}
		if _, err := s.RenewLease(c, "acme", "metering", "b", b.Epoch, late, ttl); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("superseded holder renewing: %v, want ErrLeaseLost", err)
		}
		// Release, then acquire again: the ended rows are pruned, the
		// epoch still grows.
		if err := s.ReleaseLease(c, "acme", "metering", "c", cl.Epoch, late); err != nil {
			t.Fatal(err)
		}
		if err := s.ReleaseLease(c, "acme", "metering", "c", cl.Epoch, late); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("second release: %v, want ErrLeaseLost", err)
		}
		if _, err := s.ActiveLease(c, "acme", "metering"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("active lease after release: %v, want ErrNotFound", err)
		}
		d, err := s.AcquireLease(c, "acme", "metering", "a", late, ttl, nil)
		if err != nil || d.Epoch <= cl.Epoch {
			t.Fatalf("acquire after release: %+v, %v; want an epoch above %d", d, err, cl.Epoch)
		}
		var rows int
		if err := s.db.QueryRowContext(c, `SELECT COUNT(*) FROM egress_leases`).Scan(&rows); err != nil || rows != 1 {
			t.Fatalf("%d lease rows (%v), want 1: ended ones are pruned", rows, err)
		}
		ls, err := s.ActiveLeases(c, "acme")
		if err != nil || len(ls) != 1 || ls[0].Holder != "a" || ls[0].Epoch != d.Epoch {
			t.Fatalf("active leases %+v, %v", ls, err)
		}
		if ls, err := s.ActiveLeases(c, "other"); err != nil || len(ls) != 0 {
			t.Fatalf("another org's leases %+v, %v", ls, err)
		}
	})
}

// TestPartialUniqueIndex: the database itself refuses a second active
// lease of a scope, whatever the code above it does.
func TestPartialUniqueIndex(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		c := ctx(t)
		ins := `INSERT INTO egress_leases (org, class, epoch, holder, active, acquired_at, renewed_at, expires_at) VALUES (?, 'metering', ?, 'x', ?, 1, 1, 1)`
		for _, r := range []struct {
			epoch, active int
			unique        bool
		}{{1, 0, false}, {2, 1, false}, {3, 0, false}, {4, 1, true}} {
			_, err := s.db.ExecContext(c, s.q(ins), "acme", r.epoch, r.active)
			if isUnique(err) != r.unique || (err != nil && !r.unique) {
				t.Fatalf("epoch %d active %d: %v, want unique violation %t", r.epoch, r.active, err, r.unique)
			}
		}
	})
}

func TestEgressPoliciesAndMembers(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		c := ctx(t)
		p := EgressPolicy{Org: "acme", Class: "metering", Destination: "https://ingest.example/m", Region: "eu", RequireZone: "eu-1", UpdatedAt: leaseT0}
		if err := s.PutEgressPolicy(c, p); err != nil {
			t.Fatal(err)
		}
		p.Destination = "https://ingest.example/m2"
		if err := s.PutEgressPolicy(c, p); err != nil {
			t.Fatal(err)
		}
		got, err := s.EgressPolicyFor(c, "acme", "metering")
		if err != nil || got != p {
			t.Fatalf("policy %+v, %v; want %+v", got, err, p)
		}
		if _, err := s.EgressPolicyFor(c, "acme", "license"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing policy: %v", err)
		}
		if ps, err := s.EgressPolicies(c, ""); err != nil || len(ps) != 1 {
			t.Fatalf("policies %+v, %v", ps, err)
		}
		if err := s.DeleteEgressPolicy(c, "acme", "metering"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteEgressPolicy(c, "acme", "metering"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}

		e := newEdge(t, s, "fra-1")
		if e.Priority != 0 || e.Region != "" {
			t.Fatalf("topology as given: %+v", e.Topology)
		}
		tp := Topology{Region: "eu", Zone: "eu-1", Priority: 10, CostTier: 2, Weight: 50}
		if err := s.SetTopology(c, e.ID, tp); err != nil {
			t.Fatal(err)
		}
		if e, err = s.Edge(c, e.ID); err != nil || e.Topology != tp {
			t.Fatalf("edge topology %+v, %v; want %+v", e.Topology, err, tp)
		}
		// Not enrolled: not a member, however recently seen.
		if err := s.Touch(c, map[string]time.Time{e.ID: leaseT0}); err != nil {
			t.Fatal(err)
		}
		if ms, err := s.EgressMembers(c, "acme", "metering", "https://d/m", leaseT0.Add(-time.Minute), leaseT0); err != nil || len(ms) != 0 {
			t.Fatalf("members before enrollment %+v, %v", ms, err)
		}
		if err := s.Enroll(c, e.ID, "tok-fra-1", "csr", "pem", "serial"); err != nil {
			t.Fatal(err)
		}
		reach := map[string]Reach{
			"metering": {Destination: "https://d/m", Reachable: true, CheckedAt: leaseT0},
			"license":  {Destination: "https://d/l", Reachable: false, CheckedAt: leaseT0},
		}
		if err := s.PutEgressReport(c, e.ID, "https://127.0.0.1:1/", reach); err != nil {
			t.Fatal(err)
		}
		for _, q := range []struct {
			class, dest string
			fresh       time.Time
			reachable   bool
		}{
			{"metering", "https://d/m", leaseT0, true},
			{"metering", "https://d/m", leaseT0.Add(time.Millisecond), false}, // stale probe
			{"metering", "https://d/other", leaseT0, false},                   // another destination
			{"license", "https://d/l", leaseT0, false},                        // probed, unreachable
			{"siem_forwarding", "https://d/m", leaseT0, false},                // never probed
		} {
			ms, err := s.EgressMembers(c, "acme", q.class, q.dest, leaseT0.Add(-time.Minute), q.fresh)
			if err != nil || len(ms) != 1 || ms[0].Topology != tp || ms[0].IntakeURL != "https://127.0.0.1:1/" || ms[0].Reachable != q.reachable {
				t.Fatalf("members for %+v: %+v, %v", q, ms, err)
			}
		}
		// A new report replaces the old one whole.
		if err := s.PutEgressReport(c, e.ID, "", nil); err != nil {
			t.Fatal(err)
		}
		if ms, err := s.EgressMembers(c, "acme", "metering", "https://d/m", leaseT0.Add(-time.Minute), leaseT0); err != nil || len(ms) != 1 ||
			ms[0].Reachable || ms[0].IntakeURL != "" {
			t.Fatalf("members after an empty report: %+v, %v", ms, err)
		}
		if ms, err := s.EgressMembers(c, "acme", "metering", "https://d/m", leaseT0.Add(time.Second), leaseT0); err != nil || len(ms) != 0 {
			t.Fatalf("members seen since after its last sighting: %+v, %v", ms, err)
		}
		if ms, err := s.EgressMembers(c, "other", "metering", "https://d/m", leaseT0.Add(-time.Minute), leaseT0); err != nil || len(ms) != 0 {
			t.Fatalf("another org's members: %+v, %v", ms, err)
		}
	})
}
