package adminapi

import (
	"encoding/json"
	"time"

	"cellvisor/manifest"
)

// EdgeView is an edge as the admin API shows it. Secrets are never in it.
type EdgeView struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Org        string `json:"org"`
	Country    string `json:"country"`
	Continent  string `json:"continent"`
	MgmtIPv4   string `json:"mgmt_ipv4,omitempty"`
	MgmtIPv6   string `json:"mgmt_ipv6,omitempty"`
	Slots      int    `json:"slots"`
	Enrollment string `json:"enrollment"`
	// EncryptionKeyID is the hex SHA-256 of the edge's encryption public
	// key, which its certificates' keys are sealed to (edge show only).
	EncryptionKeyID string `json:"encryption_key_id,omitempty"`
	// HTTPSKeys says when the edge gets no certificate keys (edge show
	// only): it has registered no encryption key, so its cells serve
	// HTTP only.
	HTTPSKeys  string     `json:"https_keys,omitempty"`
	EnrolledAt *time.Time `json:"enrolled_at,omitempty"`
	// TokenExpiresAt is when the bootstrap token stops enrolling, while
	// the edge is pending enrollment.
	TokenExpiresAt *time.Time `json:"token_expires_at,omitempty"`
	// CertExpiresAt is when the edge's current client certificate expires
	// (the edge renews it before); RenewalPending says a renewed one was
	// issued that the edge has not used yet.
	CertExpiresAt  *time.Time        `json:"cert_expires_at,omitempty"`
	RenewalPending bool              `json:"renewal_pending,omitempty"`
	Rotations      int               `json:"rotations"`
	LastSeen       *time.Time        `json:"last_seen,omitempty"`
	Sequence       int64             `json:"sequence"`
	ActiveSequence int64             `json:"active_sequence"`
	Assignments    map[string]string `json:"assignments,omitempty"`
	Cells          []CellView        `json:"cells,omitempty"`
	// Pools are the edge's pools and their ready cells (one edge only).
	Pools          []PoolHealth    `json:"pools,omitempty"`
	SecurityEvents []SecurityEvent `json:"security_events,omitempty"`
	// Certificates are the cells' HTTPS certificates, from the last
	// status: cells that present any.
	Certificates []CellCertificates `json:"certificates,omitempty"`
	// Runtime is the cells' binary, from the last status.
	Runtime  *RuntimeView `json:"runtime,omitempty"`
	StatusAt *time.Time   `json:"status_at,omitempty"`
	// Status, Acks and Tasks are shown for one edge only.
	Status json.RawMessage `json:"status,omitempty"`
	Acks   []manifest.Ack  `json:"acks,omitempty"`
	Tasks  []TaskView      `json:"tasks,omitempty"`
	// Drains are the edge's cell drains, the latest of each cell (one
	// edge only).
	Drains []DrainView `json:"drains,omitempty"`

	// Region, Zone and the egress ranking (lower priority and cost tier,
	// higher weight preferred).
	Region   string `json:"region,omitempty"`
	Zone     string `json:"zone,omitempty"`
	Priority int    `json:"priority"`
	CostTier int    `json:"cost_tier"`
	Weight   int    `json:"weight"`
}

// CellView is one cell as the edge last reported it.
type CellView struct {
	Name     string `json:"name"`
	Pool     string `json:"pool,omitempty"`
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
	Drained  bool   `json:"drained"`
	Sequence int64  `json:"sequence"`
	// RuntimeVersion is the binary the cell's master runs, as its agent
	// reported it; RuntimeSuperseded says its file was replaced since (a
	// package upgrade the cell is not rolled onto yet).
	RuntimeVersion    string `json:"runtime_version,omitempty"`
	RuntimeSuperseded bool   `json:"runtime_superseded,omitempty"`
}

// RuntimeView is an edge's cell binary as its agent reported it.
type RuntimeView struct {
	Version string `json:"version,omitempty"`
	// Superseded counts the cells still running a replaced binary; Upgrade
	// is the roll onto the new one ("", rolling, refused, failed, waiting)
	// and Reason why.
	Superseded int    `json:"superseded"`
	Upgrade    string `json:"upgrade,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// SecurityEvent summarizes a cell's refused private calls.
// CellCertificates is what an edge reported of a cell's HTTPS
// certificates: how many it presents and the one that expires first.
type CellCertificates struct {
	Cell          string    `json:"cell"`
	Count         int       `json:"count"`
	SoonestDomain string    `json:"soonest_domain"`
	SoonestExpiry time.Time `json:"soonest_expiry"`
}

type SecurityEvent struct {
	Cell         string     `json:"cell"`
	AuthFailures int64      `json:"auth_failures"`
	LastAt       *time.Time `json:"last_at,omitempty"`
	LastReason   string     `json:"last_reason,omitempty"`
}

// EdgeRequest creates an edge.
type EdgeRequest struct {
	Name      string `json:"name"`
	Org       string `json:"org"`
	Country   string `json:"country"`
	Continent string `json:"continent"`
	// MgmtIPv4 and MgmtIPv6 are inventory for operator access and
	// monitoring: never used for control delivery or customer traffic.
	MgmtIPv4 string `json:"mgmt_ipv4,omitempty"`
	MgmtIPv6 string `json:"mgmt_ipv6,omitempty"`
	// Slots is 1–32; zero means DefaultSlots. Fixed once created.
	Slots int `json:"slots,omitempty"`
	// TokenTTL is how long the bootstrap token enrolls, a Go duration from
	// MinTokenTTL to MaxTokenTTL; empty means DefaultTokenTTL.
	TokenTTL string `json:"token_ttl,omitempty"`
	// Region, Zone and the egress ranking (absent: priority 100, cost
	// tier 0, weight 100), changed later with PATCH /v1/edges/{id}.
	EdgeUpdateRequest
}

// EdgeUpdateRequest changes an edge's topology and ranking (PATCH
// /v1/edges/{id}); an absent field keeps its value.
type EdgeUpdateRequest struct {
	Region   *string `json:"region,omitempty"`
	Zone     *string `json:"zone,omitempty"`
	Priority *int    `json:"priority,omitempty"`
	CostTier *int    `json:"cost_tier,omitempty"`
	Weight   *int    `json:"weight,omitempty"`
}

// CreatedEdge is a new edge and its one-time bootstrap token, shown once.
type CreatedEdge struct {
	Edge  EdgeView `json:"edge"`
	Token string   `json:"token"`
	// TokenExpiresAt is when the token stops enrolling.
	TokenExpiresAt time.Time `json:"token_expires_at"`
	// CA is what the agent passes as --ca-file.
	CA string `json:"ca"`
}

// RotateRequest is an identity rotation's optional body.
type RotateRequest struct {
	// TokenTTL is how long the new bootstrap token enrolls, a Go duration
	// from MinTokenTTL to MaxTokenTTL; empty means DefaultTokenTTL.
	TokenTTL string `json:"token_ttl,omitempty"`
}

// TaskRequest creates a control task.
type TaskRequest struct {
	Cell   string `json:"cell"`
	Action string `json:"action"`
}

// TaskView is a control task.
type TaskView struct {
	ID        int64      `json:"id"`
	EdgeID    string     `json:"edge_id"`
	Cell      string     `json:"cell"`
	Action    string     `json:"action"`
	State     string     `json:"state"`
	Result    string     `json:"result,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	DoneAt    *time.Time `json:"done_at,omitempty"`
}

// CellRequest assigns a cell to a pool (PUT /v1/edges/{id}/cells/{cell}).
type CellRequest struct {
	Pool string `json:"pool"`
}

// CellAssignment is the outcome of assigning or unassigning a cell: done
// in Sequence (200), or, for a cell that holds domains, a drain started
// (202) that moves them to the pool's other cells first and changes the
// assignment when they serve there (edge show follows it).
type CellAssignment struct {
	EdgeID   string     `json:"edge_id"`
	Cell     string     `json:"cell"`
	Pool     string     `json:"pool,omitempty"`
	Sequence int64      `json:"sequence"`
	Drain    *DrainView `json:"drain,omitempty"`
}

// DrainView is a cell's drain ahead of its unassignment (To empty) or
// reassignment, with its steps. Its states are a move's.
type DrainView struct {
	Cell       string     `json:"cell"`
	From       string     `json:"from"`
	To         string     `json:"to,omitempty"`
	State      string     `json:"state"`
	Reason     string     `json:"reason,omitempty"`
	Domains    []string   `json:"domains"`
	StartedAt  time.Time  `json:"started_at"`
	Deadline   time.Time  `json:"deadline"`
	DrainUntil *time.Time `json:"drain_until,omitempty"`
	Steps      []MoveStep `json:"steps"`
	// WaitingFor says what a drain under way waits for.
	WaitingFor string `json:"waiting_for,omitempty"`
}
