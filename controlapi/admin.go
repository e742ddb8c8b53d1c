package controlapi

import (
	"encoding/json"
	"net/http"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/metrics"
	"cellvisor/controlapi/store"
	"cellvisor/manifest"
)

// Admin API paths.
const (
	AdminCA      = "/v1/ca"
	AdminEdges   = "/v1/edges"
	AdminPools   = "/v1/pools"
	AdminDomains = "/v1/domains"
	AdminRouting = "/v1/routing"
)

// EdgeView is an edge as the admin API shows it. Secrets are never in it.
type EdgeView struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Org        string     `json:"org"`
	Country    string     `json:"country"`
	Continent  string     `json:"continent"`
	MgmtIPv4   string     `json:"mgmt_ipv4,omitempty"`
	MgmtIPv6   string     `json:"mgmt_ipv6,omitempty"`
	Slots      int        `json:"slots"`
	Enrollment string     `json:"enrollment"`
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
	StatusAt       *time.Time      `json:"status_at,omitempty"`
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

// Enrollment states.
const (
	EnrollmentPending  = "pending"
	EnrollmentEnrolled = "enrolled"
)

// CellView is one cell as the edge last reported it.
type CellView struct {
	Name     string `json:"name"`
	Pool     string `json:"pool,omitempty"`
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
	Drained  bool   `json:"drained"`
	Sequence int64  `json:"sequence"`
}

// SecurityEvent summarizes a cell's refused private calls.
type SecurityEvent struct {
	Cell         string     `json:"cell"`
	AuthFailures int64      `json:"auth_failures"`
	LastAt       *time.Time `json:"last_at,omitempty"`
	LastReason   string     `json:"last_reason,omitempty"`
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

// PoolRequest creates a pool (POST /v1/pools) or updates one (PATCH
// /v1/pools/{name}, without name and replicas). An absent field keeps its
// value: the class's default on create (see docs/placement.md).
type PoolRequest struct {
	Name string `json:"name,omitempty"`
	// Replicas per edge: 1 for shared and quarantine pools, 1–3 for
	// reserved and dedicated; set at creation only.
	Replicas *int `json:"replicas,omitempty"`
	// Bound is the most domains per cell; 0 for none.
	Bound *int `json:"bound,omitempty"`
	// MinReady is the fewest ready cells on an edge for new placements.
	MinReady *int `json:"min_ready,omitempty"`
	// Drain is a Go duration: how long a domain moving out keeps its cells.
	Drain    *string `json:"drain,omitempty"`
	MaxConns *int    `json:"max_conns,omitempty"`
	Rate     *int    `json:"rate,omitempty"`
	Burst    *int    `json:"burst,omitempty"`
}

// PoolView is a pool, with its cells on every edge for one pool.
type PoolView struct {
	Name      string    `json:"name"`
	Class     string    `json:"class"`
	Replicas  int       `json:"replicas"`
	Bound     int       `json:"bound"`
	MinReady  int       `json:"min_ready"`
	Drain     string    `json:"drain"`
	MaxConns  int       `json:"max_conns"`
	Rate      int       `json:"rate"`
	Burst     int       `json:"burst"`
	CreatedAt time.Time `json:"created_at"`
	// Edges are the pool's cells on each edge (shown for one pool).
	Edges []PoolHealth `json:"edges,omitempty"`
	// Sequences maps each edge whose manifest advanced (an update of the
	// cells' limits) to its new sequence.
	Sequences map[string]int64 `json:"sequences,omitempty"`
}

// PoolHealth is one pool's cells on one edge and whether enough of them
// are ready: below its minimum, the pool takes no new placements there.
type PoolHealth struct {
	Pool     string   `json:"pool"`
	EdgeID   string   `json:"edge_id"`
	EdgeName string   `json:"edge_name,omitempty"`
	Cells    []string `json:"cells"`
	// Ready counts the cells the edge reports ready; Reported is false
	// before its first status report (then it is not judged).
	Ready        int    `json:"ready"`
	Reported     bool   `json:"reported"`
	MinReady     int    `json:"min_ready"`
	BelowMinimum bool   `json:"below_minimum"`
	Reason       string `json:"reason,omitempty"`
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
// reassignment, with its steps.
type DrainView struct {
	Cell       string           `json:"cell"`
	From       string           `json:"from"`
	To         string           `json:"to,omitempty"`
	State      string           `json:"state"`
	Reason     string           `json:"reason,omitempty"`
	Domains    []string         `json:"domains"`
	StartedAt  time.Time        `json:"started_at"`
	Deadline   time.Time        `json:"deadline"`
	DrainUntil *time.Time       `json:"drain_until,omitempty"`
	Steps      []store.MoveStep `json:"steps"`
	// WaitingFor says what a drain under way waits for.
	WaitingFor string `json:"waiting_for,omitempty"`
}

// MoveRequest starts a domain's move (POST /v1/domains/{name}/move).
type MoveRequest struct {
	To string `json:"to"`
}

// MoveView is a domain's latest move and its steps.
type MoveView struct {
	Domain     string           `json:"domain"`
	From       string           `json:"from"`
	To         string           `json:"to"`
	State      string           `json:"state"`
	Reason     string           `json:"reason,omitempty"`
	StartedAt  time.Time        `json:"started_at"`
	Deadline   time.Time        `json:"deadline"`
	DrainUntil *time.Time       `json:"drain_until,omitempty"`
	Steps      []store.MoveStep `json:"steps"`
	// WaitingFor says what a move under way waits for.
	WaitingFor string `json:"waiting_for,omitempty"`
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

// RoutingView is what DNS would publish for a domain: its active cells.
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
}

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
	Move       *MoveView       `json:"move,omitempty"`
}

// PublishedView is the outcome of publishing or deleting a domain.
type PublishedView struct {
	Domain DomainView `json:"domain"`
	// Edges maps each edge whose manifest advanced to its new sequence.
	Edges map[string]int64 `json:"edges"`
	// Skipped maps each edge of the pool where the domain could not be
	// placed (too few ready cells, no room) to the reason.
	Skipped map[string]string `json:"skipped,omitempty"`
}

// AdminHandler serves the admin API behind the bearer token.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+AdminCA, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-pem-file")
		w.Write([]byte(s.ca.PEM))
	})
	mux.HandleFunc("POST "+AdminEdges, s.handle(s.createEdge))
	mux.HandleFunc("GET "+AdminEdges, s.handle(s.listEdges))
	mux.HandleFunc("GET "+AdminEdges+"/{id}", s.handle(s.showEdge))
	mux.HandleFunc("POST "+AdminEdges+"/{id}/rotate", s.handle(s.rotateEdge))
	mux.HandleFunc("DELETE "+AdminEdges+"/{id}", s.handle(s.deleteEdge))
	mux.HandleFunc("POST "+AdminEdges+"/{id}/tasks", s.handle(s.createTask))
	mux.HandleFunc("GET "+AdminEdges+"/{id}/tasks", s.handle(s.listTasks))
	mux.HandleFunc("GET "+AdminPools, s.handle(s.listPools))
	mux.HandleFunc("POST "+AdminPools, s.handle(s.createPool))
	mux.HandleFunc("GET "+AdminPools+"/{name}", s.handle(s.showPool))
	mux.HandleFunc("PATCH "+AdminPools+"/{name}", s.handle(s.updatePool))
	mux.HandleFunc("DELETE "+AdminPools+"/{name}", s.handle(s.deletePool))
	mux.HandleFunc("PUT "+AdminEdges+"/{id}/cells/{cell}", s.handle(s.assignCell))
	mux.HandleFunc("DELETE "+AdminEdges+"/{id}/cells/{cell}", s.handle(s.unassignCell))
	mux.HandleFunc("POST "+AdminDomains+"/{name}/move", s.handle(s.startMove))
	mux.HandleFunc("DELETE "+AdminDomains+"/{name}/move", s.handle(s.cancelMove))
	mux.HandleFunc("GET "+AdminRouting+"/{name}", s.handle(s.routing))
	mux.HandleFunc("GET "+AdminDomains, s.handle(s.listDomains))
	mux.HandleFunc("GET "+AdminDomains+"/{name}", s.handle(s.showDomain))
	mux.HandleFunc("PUT "+AdminDomains+"/{name}", s.handle(s.publishDomain))
	mux.HandleFunc("DELETE "+AdminDomains+"/{name}", s.handle(s.deleteDomain))
	mux.HandleFunc("POST "+AdminDomains+"/{name}/rollback", s.handle(s.rollbackDomain))
	mux.HandleFunc("POST "+AdminKeys+"/rotate", s.handle(s.rotateKey))
	mux.HandleFunc("PUT "+AdminEdges+"/{id}/frontdoor", s.handle(s.setFrontDoor))
	mux.HandleFunc("DELETE "+AdminEdges+"/{id}/frontdoor", s.handle(s.clearFrontDoor))
	mux.HandleFunc("GET "+AdminFrontDoors, s.handle(s.listFrontDoors))
	mux.HandleFunc("GET "+AdminFrontDoors+"/resolve", s.handle(s.resolveFrontDoor))
	s.egressAdminRoutes(mux)
	mux.Handle("GET "+PathMetrics, s.metrics.Handler())
	fleet := s.fleetHandler() // authenticates by itself: session cookie or bearer token
	return s.instrument(metrics.Admin, mux, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isFleetPath(r.URL.Path) {
			fleet.ServeHTTP(w, r)
			return
		}
		given, ok := bearer(r, s.o.AdminToken)
		if !ok && !s.metricsAllowed(r) {
			msg := "admin bearer token required"
			if given {
				msg = "admin bearer token rejected"
			}
			s.log.Warn("security: admin request without the admin token", zap.String("remote", r.RemoteAddr),
				zap.String("path", r.URL.Path), zap.Bool("token_given", given))
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": msg})
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

// InitialAssignments are a new edge's: cell-01 → shared-default, cell-02 →
// quarantine-default (on an edge with 2 or more slots), the rest unassigned,
// as the agent creates them.
func InitialAssignments(slots int) map[string]string {
	a := map[string]string{"cell-01": "shared-default"}
	if slots >= 2 {
		a["cell-02"] = "quarantine-default"
	}
	return a
}
