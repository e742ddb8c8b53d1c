package adminapi

import (
	"encoding/json"
	"net"
	"strconv"
	"time"
)

// MoveRequest starts a domain's move (POST /v1/domains/{name}/move).
type MoveRequest struct {
	To string `json:"to"`
}

// MoveView is a domain's latest move and its steps.
type MoveView struct {
	Domain     string     `json:"domain"`
	From       string     `json:"from"`
	To         string     `json:"to"`
	State      string     `json:"state"`
	Reason     string     `json:"reason,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	Deadline   time.Time  `json:"deadline"`
	DrainUntil *time.Time `json:"drain_until,omitempty"`
	Steps      []MoveStep `json:"steps"`
	// WaitingFor says what a move under way waits for.
	WaitingFor string `json:"waiting_for,omitempty"`
}

// MoveStep is one step of a move or a cell's drain, when it happened.
type MoveStep struct {
	Step   string    `json:"step"`
	At     time.Time `json:"at"`
	Detail string    `json:"detail,omitempty"`
}

// PlacementView is one cell of a domain on an edge.
type PlacementView struct {
	EdgeID string `json:"edge_id"`
	Cell   string `json:"cell"`
	Pool   string `json:"pool"`
	// Role is active, target (receiving it during a move) or leaving
	// (serving it while routing drains away).
	Role string `json:"role"`
}

// RoutingView is what DNS would publish for a domain: its active cells
// that are ready and serve its current revision; while none does yet (a
// publish on its way), those that are ready and serve an earlier one.
type RoutingView struct {
	Domain string  `json:"domain"`
	Pool   string  `json:"pool"`
	Routes []Route `json:"routes"`
}

// Route is one active cell of a domain that its edge last reported ready
// (the routing view lists no other): the edge's address (its
// management address stands in for a public one) and the cell's HTTP
// port from the edge's last status report (0 before one).
type Route struct {
	EdgeID   string `json:"edge_id"`
	EdgeName string `json:"edge_name"`
	Cell     string `json:"cell"`
	Address  string `json:"address,omitempty"`
	Port     int    `json:"port"`
	// Revision is the domain's revision the cell serves: the current one
	// but while no active cell serves it yet.
	Revision int64 `json:"revision"`
}

// HostPort joins a route's address and port.
func (rt Route) HostPort() string { return net.JoinHostPort(rt.Address, strconv.Itoa(rt.Port)) }

// DomainRequest publishes a domain's next revision.
type DomainRequest struct {
	Pool string `json:"pool"`
	// Config is the domain's configuration (domain.Domain); its domain,
	// pool and revision are set by the control plane.
	Config json.RawMessage `json:"config"`
}

// DomainView is a domain's current revision; for one domain, its cells
// and its latest move too.
type DomainView struct {
	Name       string          `json:"name"`
	Pool       string          `json:"pool"`
	Revision   int64           `json:"revision"`
	SHA256     string          `json:"sha256"`
	Size       int64           `json:"size"`
	UpdatedAt  time.Time       `json:"updated_at"`
	Placements []PlacementView `json:"placements,omitempty"`
	// Cells are the domain's cells (its placements) with what each serves,
	// by the edge's last status report.
	Cells []DomainCell `json:"cells,omitempty"`
	Move  *MoveView    `json:"move,omitempty"`
}

// DomainCell is one cell of a domain on an edge, as the edge last reported
// it: its state and the domain's revision it serves.
type DomainCell struct {
	EdgeID   string `json:"edge_id"`
	EdgeName string `json:"edge_name"`
	Cell     string `json:"cell"`
	Pool     string `json:"pool"`
	// Role is the placement's: active, target or leaving.
	Role string `json:"role"`
	// State is the cell's state in the edge's last status report ("" when
	// the report has none).
	State string `json:"state"`
	// Sequence is the edge's manifest sequence the cell confirmed it
	// serves (0: none).
	Sequence int64 `json:"sequence"`
	// Revision is the domain's revision that sequence gives the cell: 0
	// when none (not applied yet, or a sequence too old to tell).
	Revision int64 `json:"revision"`
	// Current is whether Revision is the domain's current revision.
	Current bool `json:"current"`
}

// PublishedView is the outcome of publishing or deleting a domain.
type PublishedView struct {
	Domain DomainView `json:"domain"`
	// Edges maps each edge whose manifest advanced at once to its new
	// sequence: none for a publish, a rollback or a delete, which fan out.
	Edges map[string]int64 `json:"edges"`
	// Publish is the id of the fan-out (0 when nothing fanned out).
	Publish int64 `json:"publish,omitempty"`
	// EdgesPending counts the edges where the domain is placed (was, for a
	// delete): each builds its new manifest at its next poll.
	EdgesPending int `json:"edges_pending"`
	// Skipped maps each edge of the pool where the domain could not be
	// placed (too few ready cells, no room) to the reason.
	Skipped map[string]string `json:"skipped,omitempty"`
}

// RollbackRequest asks for a domain's earlier revision back.
type RollbackRequest struct {
	// To is the revision to republish, lower than the current one.
	To int64 `json:"to"`
}

// RotatedView is the outcome of a signing-key rotation.
type RotatedView struct {
	// PublicKey is the new standard base64 Ed25519 key; Previous the one it
	// replaced.
	PublicKey string `json:"public_key"`
	Previous  string `json:"previous"`
	// Edges maps each edge whose manifest advanced (re-signed, announcing
	// the rotation) to its new sequence.
	Edges map[string]int64 `json:"edges"`
}
