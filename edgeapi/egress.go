package edgeapi

import (
	"encoding/json"
	"time"
)

// Governed egress: paths and bodies between an agent and the control API,
// and between two agents of one org (a peer's forward to the lease holder's
// intake). Classes are the wire names of package egress ("metering",
// "siem_forwarding", ...). Answers are read leniently.
const (
	// PathEgressElect takes an ElectRequest (POST) and answers an
	// ElectResponse (200, whatever the outcome). The control API
	// re-resolves the caller's org's live membership on every call, runs
	// the election cascade, and, when the caller is the top-ranked
	// candidate, acquires or renews the (org, class) lease for it.
	PathEgressElect = "/v1/egress/elect"
	// PathEgressFence takes a FenceRequest (POST): 204 while the caller
	// holds the (org, class) lease at that epoch (and, with Peer, Peer is
	// a live edge of the caller's org); otherwise 409 with a FenceRefusal.
	// A holder fences before every direct send and before accepting a
	// forward, so that a holder frozen past its lease never commits.
	PathEgressFence = "/v1/egress/fence"
	// PathIntake + class is a lease holder's intake (served by the agent,
	// mutual TLS with the edges' enrollment identities): POST a Bundle.
	// 202 once the holder has journaled it; 409 (FenceRefusal) when the
	// receiver does not hold the lease or the sender is not of its org.
	PathIntake = "/v1/intake/"
)

// Bounds.
const (
	MaxElectBytes  = 16 << 10
	MaxBundleBytes = 1 << 20
)

// Election outcomes.
const (
	OutcomeElected  = "elected"
	OutcomeDeferred = "deferred"
	OutcomeRefused  = "refused"
)

// Election stages, the seed's table.
const (
	StageLiveResolve = "live_resolve"
	StageNoBlackHole = "no_black_hole"
	StageRanking     = "ranking"
	StageLeaseRace   = "lease_race"
	StageSingle      = "single" // the org has one live edge: it elects itself
)

// Requirement is a hard requirement on the owner: a field left empty does
// not constrain. A requirement no live candidate meets is refused, never
// relaxed.
type Requirement struct {
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
}

// ElectRequest asks who owns (org of the caller, Class). Reachable is the
// caller's own fresh probe of the class's destination (its other
// candidates' come from their status reports).
type ElectRequest struct {
	Class     string `json:"class"`
	Reachable bool   `json:"reachable"`
}

// Holder is the current lease holder as a peer reaches it.
type Holder struct {
	EdgeID    string    `json:"edge_id"`
	Region    string    `json:"region,omitempty"`
	IntakeURL string    `json:"intake_url,omitempty"`
	Epoch     int64     `json:"epoch"`
	ExpiresAt time.Time `json:"expires_at"`
}

// ElectResponse is the cascade's answer for the caller.
type ElectResponse struct {
	Class   string `json:"class"`
	Outcome string `json:"outcome"` // OutcomeElected, OutcomeDeferred or OutcomeRefused
	Stage   string `json:"stage"`
	Reason  string `json:"reason"`
	// Destination is the class's destination URL for the org (the control
	// API's egress policy); empty when refused for want of one.
	Destination string `json:"destination,omitempty"`
	// Holder is the current lease holder (the caller itself when elected),
	// nil when no live lease exists.
	Holder *Holder `json:"holder,omitempty"`
	// Alone: the caller is its org's only live candidate (it sends direct).
	Alone bool `json:"alone,omitempty"`
	// Renew is when the caller should ask again at the latest (a fraction
	// of the lease duration).
	Renew time.Duration `json:"renew_ns"`
}

// FenceRequest checks the caller's lease before it commits a send.
type FenceRequest struct {
	Class string `json:"class"`
	Epoch int64  `json:"epoch"`
	// Peer, on an intake's check, is the forwarding edge's id (its client
	// certificate's CN): it must be a live edge of the holder's org.
	Peer string `json:"peer,omitempty"`
}

// FenceRefusal says why a fence or an intake refused.
type FenceRefusal struct {
	Reason string  `json:"reason"`
	Holder *Holder `json:"holder,omitempty"`
}

// Bundle is one unit of outbound traffic of a class, delivered at least
// once and ingested idempotently by ID at its destination.
type Bundle struct {
	ID        string    `json:"id"` // 128 random bits, hex
	Org       string    `json:"org"`
	Class     string    `json:"class"`
	Origin    string    `json:"origin"` // the edge that produced it
	CreatedAt time.Time `json:"created_at"`
	// Items is the class's payload (security events, per-cell request
	// counts), opaque to the send path.
	Items json.RawMessage `json:"items"`
}

// Headers on a bundle delivered to its destination.
const (
	HeaderBundleID = "X-Cellvisor-Bundle"
	// HeaderEpoch is the sender's lease epoch; 0 for a fallback direct
	// send by a non-holder.
	HeaderEpoch  = "X-Cellvisor-Epoch"
	HeaderSender = "X-Cellvisor-Sender"
)

// EgressReport is the egress part of an agent's status report (the status
// JSON's "egress" field): where its intake listens and what its probes of
// class destinations found.
type EgressReport struct {
	IntakeURL string                 `json:"intake_url,omitempty"`
	Reach     map[string]ReachReport `json:"reach,omitempty"` // by class
}

// ReachReport is one probe of a class's destination.
type ReachReport struct {
	Destination string    `json:"destination"`
	Reachable   bool      `json:"reachable"`
	CheckedAt   time.Time `json:"checked_at"`
}
