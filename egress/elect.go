package egress

import (
	"slices"
	"time"

	"cellvisor/edgeapi"
)

// Race is Decide's outcome for the caller that should hold the lease: it
// acquires it (or renews its own, or takes over Supersede). It never goes
// on the wire: the control API turns it into elected or deferred.
const Race = "race"

// Reason codes, stable: operators and tests match them.
const (
	ReasonNoDestination        = "no_destination"         // live_resolve: the class has no policy (destination) for the org
	ReasonNoCandidates         = "no_candidates"          // live_resolve: no live edge in the org
	ReasonHardRequirementUnmet = "hard_requirement_unmet" // live_resolve: no live edge meets the hard requirement
	ReasonNoReachable          = "no_reachable_candidate" // no_black_hole: no eligible edge reaches the destination
	ReasonNotACandidate        = "not_a_candidate"        // ranking: the caller fails the requirement or cannot reach
	ReasonOutranked            = "outranked"              // ranking: another candidate ranks higher
	ReasonLeaseHeldByPeer      = "lease_held_by_peer"     // lease_race: a peer holds a current lease
	ReasonLostRace             = "lost_race"              // lease_race: a peer acquired the lease first
	ReasonWonLease             = "won_lease"              // lease_race: the caller acquired the lease
	ReasonRenewedLease         = "renewed_lease"          // lease_race: the caller renewed its own lease
	ReasonAlone                = "alone"                  // single: the org's only live edge
)

// Candidate is one live edge of the org as the election sees it.
type Candidate struct {
	EdgeID string
	Region string
	Zone   string
	// Priority: lower is preferred. CostTier: lower is preferred. Weight:
	// higher is preferred.
	Priority int
	CostTier int
	Weight   int
	// Reachable: the edge's fresh probe of the class's destination says
	// it reaches it (unknown counts as not: deny-closed).
	Reachable bool
}

// Policy is the org's egress policy for a class.
type Policy struct {
	// Destination is the class's destination URL; empty refuses.
	Destination string
	// Region is the preferred residency region: candidates in it rank
	// first. Empty prefers none.
	Region string
	// Require is the hard requirement: never relaxed.
	Require edgeapi.Requirement
}

// Lease is the scope's active lease as stored (possibly expired).
type Lease struct {
	Holder    string
	Epoch     int64
	ExpiresAt time.Time
}

// Current reports a lease that has not expired at now.
func (l *Lease) Current(now time.Time) bool {
	return l != nil && l.Holder != "" && now.Before(l.ExpiresAt)
}

// Input is one election question: who owns (Org, Class), asked by Caller.
type Input struct {
	Org    string
	Class  Class
	Caller string
	// Candidates are the org's live edges, the caller among them.
	Candidates []Candidate
	Policy     Policy
	// Lease is the scope's active lease, nil for none.
	Lease *Lease
	Now   time.Time
}

// Decision is the cascade's answer for the caller.
type Decision struct {
	// Outcome is edgeapi.OutcomeDeferred, edgeapi.OutcomeRefused or Race.
	Outcome string
	Stage   string
	Reason  string
	// Alone: the caller is the org's only live candidate.
	Alone bool
	// Top is the top-ranked eligible candidate; empty when refused.
	Top string
	// Renew: racing means renewing the caller's own current lease.
	Renew bool
	// Supersede, when racing, is a current lease of a live holder that
	// lost its claim (outside the hard requirement, or out of region while
	// an in-region candidate is live): the caller takes it over with a new
	// epoch, which fences the old holder out.
	Supersede *Lease
	// Release: the caller holds a current lease but is refused or no
	// longer a candidate (its own probe fails): it gives the lease up.
	Release bool
}

// Decide runs the election cascade (docs/egress.md): the live re-resolve
// (hard requirement, empty set), the no-black-hole filter, the
// residency-correct ranking, then the lease. The lease is the invariant and
// locality a preference in front of it: a current holder that is live,
// eligible and in the same residency tier as the top candidate keeps its
// lease even when outranked (no flapping on a priority change); a holder
// that is live but outside the hard requirement, or out of region while an
// in-region candidate is live, is taken over by the top candidate; a
// holder whose own probe fails releases its lease; a holder that is not
// live keeps its lease until it expires, then the top one acquires.
func Decide(in Input) Decision {
	// A holder refused, or no longer a candidate, gives its lease up.
	holds := in.Lease.Current(in.Now) && in.Lease.Holder == in.Caller
	refuse := func(stage, reason string) Decision {
		return Decision{Outcome: edgeapi.OutcomeRefused, Stage: stage, Reason: reason, Release: holds}
	}
	if in.Policy.Destination == "" {
		return refuse(edgeapi.StageLiveResolve, ReasonNoDestination)
	}
	if len(in.Candidates) == 0 {
		return refuse(edgeapi.StageLiveResolve, ReasonNoCandidates)
	}
	// One pass, no copies: 1,000 candidates are decided in microseconds.
	var eligible, reachable int
	var top *Candidate
	var topScore uint64
	callerIn := false
	prefix := scorePrefix(in.Org, in.Class)
	for i := range in.Candidates {
		c := &in.Candidates[i]
		if !meets(*c, in.Policy.Require) {
			continue
		}
		eligible++
		if !c.Reachable {
			continue
		}
		reachable++
		callerIn = callerIn || c.EdgeID == in.Caller
		s := scoreFrom(prefix, c.EdgeID)
		if top == nil || ranksAbove(c, s, top, topScore, in.Policy.Region) {
			top, topScore = c, s
		}
	}
	if eligible == 0 {
		return refuse(edgeapi.StageLiveResolve, ReasonHardRequirementUnmet)
	}
	if reachable == 0 {
		return refuse(edgeapi.StageNoBlackHole, ReasonNoReachable)
	}
	d := Decision{Top: top.EdgeID}
	defer0 := func(stage, reason string) Decision {
		d.Outcome, d.Stage, d.Reason = edgeapi.OutcomeDeferred, stage, reason
		return d
	}
	if !callerIn {
		// A holder that says it cannot reach (or no longer meets the
		// requirement) gives its lease up rather than leave it to expire.
		d.Release = holds
		return defer0(edgeapi.StageRanking, ReasonNotACandidate)
	}
	alone := len(in.Candidates) == 1
	race := func() Decision {
		d.Outcome, d.Stage, d.Reason = Race, edgeapi.StageLeaseRace, ReasonWonLease
		if alone {
			d.Stage, d.Reason, d.Alone = edgeapi.StageSingle, ReasonAlone, true
		}
		return d
	}
	if !in.Lease.Current(in.Now) {
		if in.Caller != top.EdgeID {
			return defer0(edgeapi.StageRanking, ReasonOutranked)
		}
		return race()
	}
	holder := in.Lease.Holder
	hi := slices.IndexFunc(in.Candidates, func(c Candidate) bool { return c.EdgeID == holder })
	if hi < 0 {
		// Not live here: it may be partitioned from us and still sending,
		// so its lease stands until it expires.
		if in.Caller != top.EdgeID {
			return defer0(edgeapi.StageRanking, ReasonOutranked)
		}
		return defer0(edgeapi.StageLeaseRace, ReasonLeaseHeldByPeer)
	}
	h := in.Candidates[hi]
	inRegion := func(c Candidate) bool { return in.Policy.Region != "" && c.Region == in.Policy.Region }
	// A peer's word on the holder's reach may be late or missing (status
	// reports come every few seconds): only the holder's own call gives
	// its lease up for that (Release). The requirement and the region are
	// the control plane's own knowledge.
	keeps := meets(h, in.Policy.Require) && (inRegion(h) || !inRegion(*top))
	switch {
	case keeps && in.Caller == holder:
		d.Renew = true
		r := race()
		if !alone {
			r.Reason = ReasonRenewedLease
		}
		return r
	case keeps && in.Caller == top.EdgeID:
		return defer0(edgeapi.StageLeaseRace, ReasonLeaseHeldByPeer)
	case keeps, in.Caller != top.EdgeID:
		return defer0(edgeapi.StageRanking, ReasonOutranked)
	}
	d.Supersede = in.Lease
	return race()
}

// meets reports whether c satisfies the hard requirement.
func meets(c Candidate, r edgeapi.Requirement) bool {
	return (r.Region == "" || c.Region == r.Region) && (r.Zone == "" || c.Zone == r.Zone)
}

// best is the top-ranked of cs (not empty).
func best(org string, class Class, region string, cs []Candidate) Candidate {
	prefix := scorePrefix(org, class)
	top, topScore := &cs[0], scoreFrom(prefix, cs[0].EdgeID)
	for i := range cs[1:] {
		c := &cs[i+1]
		if s := scoreFrom(prefix, c.EdgeID); ranksAbove(c, s, top, topScore, region) {
			top, topScore = c, s
		}
	}
	return *top
}

// Rank orders cs residency-correct, best first: in the preferred region,
// then by priority (lower first), cost tier (lower first), weight (higher
// first), then by a rendezvous hash of (org, class, edge), so that ties
// spread an org's classes across its edges, the same on every replica.
func Rank(org string, class Class, region string, cs []Candidate) []Candidate {
	out := slices.Clone(cs)
	prefix := scorePrefix(org, class)
	scores := make(map[string]uint64, len(out))
	for _, c := range out {
		scores[c.EdgeID] = scoreFrom(prefix, c.EdgeID)
	}
	slices.SortStableFunc(out, func(a, b Candidate) int {
		switch {
		case ranksAbove(&a, scores[a.EdgeID], &b, scores[b.EdgeID], region):
			return -1
		case ranksAbove(&b, scores[b.EdgeID], &a, scores[a.EdgeID], region):
			return 1
		}
		return 0
	})
	return out
}

func ranksAbove(a *Candidate, as uint64, b *Candidate, bs uint64, region string) bool {
	if ai, bi := region != "" && a.Region == region, region != "" && b.Region == region; ai != bi {
		return ai
	}
	if a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	if a.CostTier != b.CostTier {
		return a.CostTier < b.CostTier
	}
	if a.Weight != b.Weight {
		return a.Weight > b.Weight
	}
	if as != bs {
		return as > bs
	}
	return a.EdgeID < b.EdgeID
}

const fnvPrime = 1099511628211

// scorePrefix is the FNV-1a 64 state after "org\x00class\x00".
func scorePrefix(org string, class Class) uint64 {
	h := uint64(14695981039346656037)
	for _, s := range [...]string{org, "\x00", string(class), "\x00"} {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= fnvPrime
		}
	}
	return h
}

// scoreFrom is the rendezvous hash of (org, class, edge): FNV-1a 64,
// finished with MurmurHash3's fmix64 so that close ids do not give close
// scores.
//
// Every replica of the control API must rank alike, and a change here moves
// the tie-broken leases of every org: TestRankingIsPinned holds the order.
// (Until issue 33 the second constant differed from fmix64's in its low 40
// bits: still a bijection, but no published hash; rankings were not yet
// relied on by deployments, so it became the real one.)
func scoreFrom(h uint64, edge string) uint64 {
	for i := 0; i < len(edge); i++ {
		h ^= uint64(edge[i])
		h *= fnvPrime
	}
	return fmix64(h)
}

// fmix64 is MurmurHash3's 64-bit finalizer (Austin Appleby, smhasher,
// public domain): every input bit affects every output bit.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Fence refusal reasons (edgeapi.FenceRefusal.Reason), stable.
const (
	FenceNoLease      = "no_lease"        // the scope has no active lease
	FenceNotHolder    = "not_holder"      // another edge holds the lease
	FenceStaleEpoch   = "stale_epoch"     // the caller held it at another epoch
	FenceLeaseExpired = "lease_expired"   // the caller's lease ran out
	FencePeerNotInOrg = "peer_not_in_org" // the forwarding peer is unknown or of another org
	FencePeerNotLive  = "peer_not_live"   // the forwarding peer is not a live edge
	// FencePeerNotEnrolled: the forwarding peer's identity was rotated away
	// and it has not enrolled again (the control API refuses it).
	FencePeerNotEnrolled = "peer_not_enrolled"
	FenceUnknownClass    = "unknown_class" // not one of the eight classes
)
