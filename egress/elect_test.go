package egress

import (
	"fmt"
	"testing"
	"time"

	"cellvisor/edgeapi"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func cand(id, region, zone string, reachable bool) Candidate {
	return Candidate{EdgeID: id, Region: region, Zone: zone, Priority: 100, Weight: 100, Reachable: reachable}
}

func TestDecide(t *testing.T) {
	pol := Policy{Destination: "https://ingest.example/v1", Region: "eu"}
	current := func(holder string, epoch int64) *Lease {
		return &Lease{Holder: holder, Epoch: epoch, ExpiresAt: t0.Add(time.Minute)}
	}
	expired := &Lease{Holder: "a", Epoch: 3, ExpiresAt: t0.Add(-time.Second)}
	// The top of {a, b} in eu at equal ranking is decided by the hash:
	// find it once, so the cases below say what they mean.
	top, other := "a", "b"
	if best("acme", Metering, "eu", []Candidate{cand("a", "eu", "", true), cand("b", "eu", "", true)}).EdgeID == "b" {
		top, other = "b", "a"
	}
	two := []Candidate{cand(top, "eu", "eu-1", true), cand(other, "eu", "eu-2", true)}
	cases := []struct {
		name      string
		caller    string
		cands     []Candidate
		pol       Policy
		lease     *Lease
		outcome   string
		stage     string
		reason    string
		alone     bool
		renew     bool
		supersede bool
		release   bool
		wantTopOf string
	}{
		// The seed's table, row by row.
		{name: "hard requirement matches no live cell", caller: top, cands: two,
			pol:     Policy{Destination: pol.Destination, Require: edgeapi.Requirement{Region: "us"}},
			outcome: edgeapi.OutcomeRefused, stage: edgeapi.StageLiveResolve, reason: ReasonHardRequirementUnmet},
		{name: "hard requirement zone matches no live cell", caller: top, cands: two,
			pol:     Policy{Destination: pol.Destination, Require: edgeapi.Requirement{Region: "eu", Zone: "eu-9"}},
			outcome: edgeapi.OutcomeRefused, stage: edgeapi.StageLiveResolve, reason: ReasonHardRequirementUnmet},
		{name: "empty candidate set", caller: top, cands: nil, pol: pol,
			outcome: edgeapi.OutcomeRefused, stage: edgeapi.StageLiveResolve, reason: ReasonNoCandidates},
		{name: "no candidate reaches the destination", caller: top,
			cands: []Candidate{cand(top, "eu", "", false), cand(other, "us", "", false)}, pol: pol,
			outcome: edgeapi.OutcomeRefused, stage: edgeapi.StageNoBlackHole, reason: ReasonNoReachable},
		{name: "only an edge outside the requirement reaches: refused, not relaxed", caller: top,
			cands:   []Candidate{cand(top, "eu", "", false), cand(other, "us", "", true)},
			pol:     Policy{Destination: pol.Destination, Require: edgeapi.Requirement{Region: "eu"}},
			outcome: edgeapi.OutcomeRefused, stage: edgeapi.StageNoBlackHole, reason: ReasonNoReachable},
		{name: "caller not in the set (cannot reach)", caller: other,
			cands: []Candidate{cand(top, "eu", "", true), cand(other, "eu", "", false)}, pol: pol,
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageRanking, reason: ReasonNotACandidate, wantTopOf: top},
		{name: "caller not in the set (outside the requirement)", caller: other,
			cands:   []Candidate{cand(top, "eu", "z1", true), cand(other, "eu", "z2", true)},
			pol:     Policy{Destination: pol.Destination, Require: edgeapi.Requirement{Zone: "z1"}},
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageRanking, reason: ReasonNotACandidate, wantTopOf: top},
		{name: "outranked by an in-region survivor", caller: "us-1",
			cands: []Candidate{cand("us-1", "us", "", true), cand("eu-1", "eu", "", true)}, pol: pol,
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageRanking, reason: ReasonOutranked, wantTopOf: "eu-1"},
		{name: "a peer acquired the lease first", caller: top, cands: two, pol: pol, lease: current(other, 4),
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageLeaseRace, reason: ReasonLeaseHeldByPeer, wantTopOf: top},
		{name: "top-ranked, no lease: races", caller: top, cands: two, pol: pol,
			outcome: Race, stage: edgeapi.StageLeaseRace, reason: ReasonWonLease, wantTopOf: top},
		{name: "top-ranked, expired lease: races", caller: top, cands: two, pol: pol, lease: expired,
			outcome: Race, stage: edgeapi.StageLeaseRace, reason: ReasonWonLease},
		// The deployment matrix's single-cell corner.
		{name: "single edge elects itself", caller: "a", cands: []Candidate{cand("a", "us", "", true)}, pol: pol,
			outcome: Race, stage: edgeapi.StageSingle, reason: ReasonAlone, alone: true},
		{name: "single edge renewing its own lease", caller: "a", cands: []Candidate{cand("a", "us", "", true)}, pol: pol,
			lease: current("a", 2), outcome: Race, stage: edgeapi.StageSingle, reason: ReasonAlone, alone: true, renew: true},
		{name: "single edge that cannot meet the hard requirement", caller: "a", cands: []Candidate{cand("a", "us", "", true)},
			pol:     Policy{Destination: pol.Destination, Require: edgeapi.Requirement{Region: "eu"}},
			outcome: edgeapi.OutcomeRefused, stage: edgeapi.StageLiveResolve, reason: ReasonHardRequirementUnmet},
		{name: "single edge that cannot reach", caller: "a", cands: []Candidate{cand("a", "us", "", false)}, pol: pol,
			outcome: edgeapi.OutcomeRefused, stage: edgeapi.StageNoBlackHole, reason: ReasonNoReachable},
		{name: "no policy: refused for want of a destination", caller: "a", cands: []Candidate{cand("a", "eu", "", true)},
			outcome: edgeapi.OutcomeRefused, stage: edgeapi.StageLiveResolve, reason: ReasonNoDestination},
		// The holder and its lease.
		{name: "holder outranked in its own tier keeps and renews", caller: "eu-low",
			cands: []Candidate{{EdgeID: "eu-low", Region: "eu", Priority: 200, Reachable: true}, {EdgeID: "eu-high", Region: "eu", Priority: 10, Reachable: true}},
			pol:   pol, lease: current("eu-low", 7),
			outcome: Race, stage: edgeapi.StageLeaseRace, reason: ReasonRenewedLease, renew: true, wantTopOf: "eu-high"},
		{name: "top-ranked defers to a holder of its tier", caller: "eu-high",
			cands: []Candidate{{EdgeID: "eu-low", Region: "eu", Priority: 200, Reachable: true}, {EdgeID: "eu-high", Region: "eu", Priority: 10, Reachable: true}},
			pol:   pol, lease: current("eu-low", 7),
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageLeaseRace, reason: ReasonLeaseHeldByPeer},
		{name: "in-region top takes over from an out-of-region holder", caller: "eu-1",
			cands: []Candidate{cand("us-1", "us", "", true), cand("eu-1", "eu", "", true)}, pol: pol, lease: current("us-1", 9),
			outcome: Race, stage: edgeapi.StageLeaseRace, reason: ReasonWonLease, supersede: true},
		{name: "out-of-region holder defers once an in-region edge is live", caller: "us-1",
			cands: []Candidate{cand("us-1", "us", "", true), cand("eu-1", "eu", "", true)}, pol: pol, lease: current("us-1", 9),
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageRanking, reason: ReasonOutranked},
		{name: "a peer's view of the holder as unreachable does not take it over", caller: top,
			cands: []Candidate{cand(top, "eu", "", true), cand(other, "eu", "", false)}, pol: pol, lease: current(other, 5),
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageLeaseRace, reason: ReasonLeaseHeldByPeer},
		{name: "holder whose own probe fails releases", caller: other,
			cands: []Candidate{cand(top, "eu", "", true), cand(other, "eu", "", false)}, pol: pol, lease: current(other, 5),
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageRanking, reason: ReasonNotACandidate, release: true},
		{name: "refused holder releases", caller: "a", cands: []Candidate{cand("a", "eu", "", false)}, pol: pol, lease: current("a", 2),
			outcome: edgeapi.OutcomeRefused, stage: edgeapi.StageNoBlackHole, reason: ReasonNoReachable, release: true},
		{name: "top takes over from a holder outside a new hard requirement", caller: "z1",
			cands: []Candidate{cand("z1", "eu", "z1", true), cand("z2", "eu", "z2", true)},
			pol:   Policy{Destination: pol.Destination, Require: edgeapi.Requirement{Zone: "z1"}}, lease: current("z2", 5),
			outcome: Race, stage: edgeapi.StageLeaseRace, reason: ReasonWonLease, supersede: true},
		{name: "holder not live: its lease stands until expiry", caller: top, cands: two, pol: pol, lease: current("gone", 5),
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageLeaseRace, reason: ReasonLeaseHeldByPeer},
		{name: "holder not live, caller not top", caller: other, cands: two, pol: pol, lease: current("gone", 5),
			outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageRanking, reason: ReasonOutranked},
		{name: "alone, but a departed peer's lease stands", caller: "a", cands: []Candidate{cand("a", "eu", "", true)}, pol: pol,
			lease: current("gone", 5), outcome: edgeapi.OutcomeDeferred, stage: edgeapi.StageLeaseRace, reason: ReasonLeaseHeldByPeer},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(Input{Org: "acme", Class: Metering, Caller: tc.caller, Candidates: tc.cands, Policy: tc.pol, Lease: tc.lease, Now: t0})
			if d.Outcome != tc.outcome || d.Stage != tc.stage || d.Reason != tc.reason {
				t.Fatalf("got %s/%s/%s, want %s/%s/%s", d.Outcome, d.Stage, d.Reason, tc.outcome, tc.stage, tc.reason)
			}
			if d.Alone != tc.alone || d.Renew != tc.renew || (d.Supersede != nil) != tc.supersede {
				t.Fatalf("alone %t renew %t supersede %v, want %t %t %t", d.Alone, d.Renew, d.Supersede, tc.alone, tc.renew, tc.supersede)
			}
			if d.Release != tc.release {
				t.Fatalf("release %t, want %t", d.Release, tc.release)
			}
			if tc.supersede && *d.Supersede != *tc.lease {
				t.Fatalf("supersede %+v, want %+v", *d.Supersede, *tc.lease)
			}
			if tc.wantTopOf != "" && d.Top != tc.wantTopOf {
				t.Fatalf("top %s, want %s", d.Top, tc.wantTopOf)
			}
			if tc.outcome == edgeapi.OutcomeRefused && d.Top != "" {
				t.Fatalf("refused with a top candidate %s", d.Top)
			}
		})
	}
}

func TestRank(t *testing.T) {
	cs := []Candidate{
		{EdgeID: "us-cheap", Region: "us", Priority: 1, CostTier: 0, Weight: 100},
		{EdgeID: "eu-p20", Region: "eu", Priority: 20, Weight: 100},
		{EdgeID: "eu-p10-tier2", Region: "eu", Priority: 10, CostTier: 2, Weight: 100},
		{EdgeID: "eu-p10-tier1-w50", Region: "eu", Priority: 10, CostTier: 1, Weight: 50},
		{EdgeID: "eu-p10-tier1-w90", Region: "eu", Priority: 10, CostTier: 1, Weight: 90},
	}
	got := Rank("acme", Metering, "eu", cs)
	want := []string{"eu-p10-tier1-w90", "eu-p10-tier1-w50", "eu-p10-tier2", "eu-p20", "us-cheap"}
	for i, c := range got {
		if c.EdgeID != want[i] {
			t.Fatalf("rank %d: %s, want %s (all: %v)", i, c.EdgeID, want[i], got)
		}
	}
	// With no preferred region, priority leads.
	if got := Rank("acme", Metering, "", cs); got[0].EdgeID != "us-cheap" {
		t.Fatalf("no preferred region: top %s, want us-cheap", got[0].EdgeID)
	}
	// best agrees with Rank.
	if b := best("acme", Metering, "eu", cs); b.EdgeID != want[0] {
		t.Fatalf("best %s, want %s", b.EdgeID, want[0])
	}
}

// TestTieBreakSpreadsClasses: equal edges get different classes' leases
// (the rendezvous hash), and the order does not depend on input order.
func TestTieBreakSpreadsClasses(t *testing.T) {
	var cs []Candidate
	for i := range 4 {
		cs = append(cs, cand(fmt.Sprintf("edge-%d", i), "eu", "", true))
	}
	owners := map[string]int{}
	for _, cl := range Classes {
		a := best("acme", cl, "eu", cs)
		rev := []Candidate{cs[3], cs[2], cs[1], cs[0]}
		if b := best("acme", cl, "eu", rev); a.EdgeID != b.EdgeID {
			t.Fatalf("%s: top depends on order: %s vs %s", cl, a.EdgeID, b.EdgeID)
		}
		owners[a.EdgeID]++
	}
	if len(owners) < 2 {
		t.Fatalf("8 classes over 4 equal edges all went to one edge: %v", owners)
	}
}

// BenchmarkDecide: election decisions per second for 1,000 live edges in
// one org (the pure cascade; the control API's re-resolve is benchmarked
// in controlapi).
func BenchmarkDecide(b *testing.B) {
	cs := make([]Candidate, 1000)
	for i := range cs {
		region := "eu"
		if i%2 == 1 {
			region = "us"
		}
		cs[i] = Candidate{EdgeID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i), Region: region, Priority: 100, Weight: 100, Reachable: i%7 != 0}
	}
	pol := Policy{Destination: "https://ingest.example/v1", Region: "eu"}
	lease := &Lease{Holder: cs[10].EdgeID, Epoch: 3, ExpiresAt: t0.Add(time.Minute)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		Decide(Input{Org: "acme", Class: Classes[i%len(Classes)], Caller: cs[i%len(cs)].EdgeID, Candidates: cs, Policy: pol, Lease: lease, Now: t0})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// murmur3Fmix64 is MurmurHash3's fmix64 as smhasher's MurmurHash3.cpp
// writes it (the constants BIG_CONSTANT(0xff51afd7ed558ccd) and
// BIG_CONSTANT(0xc4ceb9fe1a85ec53)).
func murmur3Fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// The score's avalanche is MurmurHash3's finalizer itself, not a look-alike
// with another constant (issue 33): an edge id of no bytes leaves the FNV
// state as it is, so the score is fmix64 of it.
func TestScoreFinishesWithMurmur3Fmix64(t *testing.T) {
	for _, h := range []uint64{0, 1, 2, 0xdeadbeef, fnvPrime, scorePrefix("acme", Metering), 1 << 63, ^uint64(0)} {
		if got, want := scoreFrom(h, ""), murmur3Fmix64(h); got != want {
			t.Errorf("scoreFrom(%#x, \"\") = %#x, want fmix64 %#x", h, got, want)
		}
	}
}

// Every control API replica must rank alike, and a deployed fleet's
// tie-broken leases stay where they are only while the hash does: this is
// the order of four equal edges for each class. A change here moves leases
// in every org on upgrade; make it on purpose, with a note in the release.
func TestRankingIsPinned(t *testing.T) {
	var cs []Candidate
	for i := range 4 {
		cs = append(cs, cand(fmt.Sprintf("edge-%d", i), "eu", "", true))
	}
	want := map[Class][]string{
		ProactiveSupport:       {"edge-3", "edge-0", "edge-1", "edge-2"},
		Metering:               {"edge-1", "edge-0", "edge-2", "edge-3"},
		License:                {"edge-0", "edge-3", "edge-1", "edge-2"},
		CapabilityCoordination: {"edge-0", "edge-1", "edge-3", "edge-2"},
		DataPlane:              {"edge-2", "edge-1", "edge-0", "edge-3"},
		ModelInference:         {"edge-2", "edge-1", "edge-3", "edge-0"},
		SIEMForwarding:         {"edge-2", "edge-0", "edge-3", "edge-1"},
		Federation:             {"edge-0", "edge-3", "edge-2", "edge-1"},
	}
	for _, cl := range Classes {
		var got []string
		for _, c := range Rank("acme", cl, "eu", cs) {
			got = append(got, c.EdgeID)
		}
		if fmt.Sprint(got) != fmt.Sprint(want[cl]) {
			t.Errorf("%s: ranked %v, want %v", cl, got, want[cl])
		}
	}
}
