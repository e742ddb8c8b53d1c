package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
		if ms, err := egressMembers(c, s, "acme", "metering", "https://d/m", leaseT0.Add(-time.Minute), leaseT0); err != nil || len(ms) != 0 {
			t.Fatalf("members before enrollment %+v, %v", ms, err)
		}
		if ee, err := s.EgressEdge(c, e.ID); err != nil || ee.Enrolled || ee.Org != "acme" || ee.Topology != tp || !ee.LastSeen.Equal(leaseT0) {
			t.Fatalf("egress edge before enrollment %+v, %v", ee, err)
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
			ms, err := egressMembers(c, s, "acme", q.class, q.dest, leaseT0.Add(-time.Minute), q.fresh)
			if err != nil || len(ms) != 1 || ms[0].Topology != tp || ms[0].Reachable != q.reachable || !ms[0].Live {
				t.Fatalf("members for %+v: %+v, %v", q, ms, err)
			}
		}
		if ee, err := s.EgressEdge(c, e.ID); err != nil || !ee.Enrolled || ee.IntakeURL != "https://127.0.0.1:1/" {
			t.Fatalf("egress edge after a report %+v, %v", ee, err)
		}
		// A new report replaces the old one whole.
		if err := s.PutEgressReport(c, e.ID, "", nil); err != nil {
			t.Fatal(err)
		}
		if ms, err := egressMembers(c, s, "acme", "metering", "https://d/m", leaseT0.Add(-time.Minute), leaseT0); err != nil || len(ms) != 1 ||
			ms[0].Reachable {
			t.Fatalf("members after an empty report: %+v, %v", ms, err)
		}
		if ee, err := s.EgressEdge(c, e.ID); err != nil || ee.IntakeURL != "" {
			t.Fatalf("egress edge after an empty report %+v, %v", ee, err)
		}
		if ms, err := egressMembers(c, s, "acme", "metering", "https://d/m", leaseT0.Add(time.Second), leaseT0); err != nil || len(ms) != 0 {
			t.Fatalf("members seen since after its last sighting: %+v, %v", ms, err)
		}
		if ms, err := egressMembers(c, s, "other", "metering", "https://d/m", leaseT0.Add(-time.Minute), leaseT0); err != nil || len(ms) != 0 {
			t.Fatalf("another org's members: %+v, %v", ms, err)
		}
		if _, err := s.EgressEdge(c, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("egress edge of an unknown id: %v", err)
		}
	})
}

// egressMember is one edge of an EgressGroups answer.
type egressMember struct {
	ID string
	Topology
	Reachable, Live bool
}

// egressMembers flattens EgressGroups, with live = since, sorted by id.
func egressMembers(c context.Context, s *Store, org, class, dest string, since, fresh time.Time) ([]egressMember, error) {
	return egressMembersLive(c, s, org, class, dest, since, since, fresh)
}

func egressMembersLive(c context.Context, s *Store, org, class, dest string, since, live, fresh time.Time) ([]egressMember, error) {
	gs, err := s.EgressGroups(c, org, class, dest, since, live, fresh)
	if err != nil {
		return nil, err
	}
	var out []egressMember
	for _, g := range gs {
		for id := range g.IDs() {
			out = append(out, egressMember{ID: id, Topology: g.Topology, Reachable: g.Reachable, Live: g.Live})
		}
	}
	slices.SortFunc(out, func(a, b egressMember) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// TestEgressGroups: edges alike in topology, reach and liveness come back
// as one group with their ids; each difference splits a group; every edge
// is in exactly one group.
func TestEgressGroups(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		c := ctx(t)
		eu := Topology{Region: "eu", Zone: "eu-1", Priority: 100, Weight: 100}
		seen := map[string]time.Time{}
		var want []egressMember
		for i := range 12 {
			e := newEdge(t, s, fmt.Sprintf("e%02d", i))
			if err := s.Enroll(c, e.ID, "tok-"+e.Name, "csr", "pem", "serial-"+e.Name); err != nil {
				t.Fatal(err)
			}
			tp := eu
			switch i % 4 {
			case 1:
				tp.Region, tp.Zone = "us", "us-1"
			case 2:
				tp.Priority = 10
			}
			if err := s.SetTopology(c, e.ID, tp); err != nil {
				t.Fatal(err)
			}
			reachable := i%3 != 0
			if err := s.PutEgressReport(c, e.ID, "", map[string]Reach{"metering": {Destination: "https://d/m", Reachable: reachable, CheckedAt: leaseT0}}); err != nil {
				t.Fatal(err)
			}
			live := i < 8
			seen[e.ID] = leaseT0
			if !live {
				seen[e.ID] = leaseT0.Add(-30 * time.Second)
			}
			want = append(want, egressMember{ID: e.ID, Topology: tp, Reachable: reachable, Live: live})
		}
		if err := s.Touch(c, seen); err != nil {
			t.Fatal(err)
		}
		gs, err := s.EgressGroups(c, "acme", "metering", "https://d/m", leaseT0.Add(-time.Minute), leaseT0.Add(-10*time.Second), leaseT0)
		if err != nil {
			t.Fatal(err)
		}
		// e00..e11 by (i%4 topology, i%3 reach, i<8 live): 12 distinct
		// keys less those that coincide.
		keys := map[egressMember]int{}
		for _, m := range want {
			keys[egressMember{Topology: m.Topology, Reachable: m.Reachable, Live: m.Live}]++
		}
		if len(gs) != len(keys) {
			t.Fatalf("%d groups, want %d: %+v", len(gs), len(keys), gs)
		}
		for _, g := range gs {
			if n := keys[egressMember{Topology: g.Topology, Reachable: g.Reachable, Live: g.Live}]; g.N != n {
				t.Fatalf("group %+v: %d edges, want %d", g, g.N, n)
			}
		}
		got, err := egressMembersLive(c, s, "acme", "metering", "https://d/m", leaseT0.Add(-time.Minute), leaseT0.Add(-10*time.Second), leaseT0)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("members\n%+v, %v\nwant\n%+v", got, err, want)
		}
	})
}
