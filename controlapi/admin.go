package controlapi

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"cellvisor/manifest"
)

// Admin API paths.
const (
	AdminCA      = "/v1/ca"
	AdminEdges   = "/v1/edges"
	AdminPools   = "/v1/pools"
	AdminDomains = "/v1/domains"
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
	SecurityEvents []SecurityEvent   `json:"security_events,omitempty"`
	StatusAt       *time.Time        `json:"status_at,omitempty"`
	// Status, Acks and Tasks are shown for one edge only.
	Status json.RawMessage `json:"status,omitempty"`
	Acks   []manifest.Ack  `json:"acks,omitempty"`
	Tasks  []TaskView      `json:"tasks,omitempty"`
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

// PoolRequest creates a pool.
type PoolRequest struct {
	Name string `json:"name"`
}

// PoolView is a pool.
type PoolView struct {
	Name      string    `json:"name"`
	Class     string    `json:"class"`
	CreatedAt time.Time `json:"created_at"`
}

// DomainRequest publishes a domain's next revision.
type DomainRequest struct {
	Pool string `json:"pool"`
	// Config is the domain's configuration (domain.Domain); its domain,
	// pool and revision are set by the control plane.
	Config json.RawMessage `json:"config"`
}

// DomainView is a domain's current revision.
type DomainView struct {
	Name      string    `json:"name"`
	Pool      string    `json:"pool"`
	Revision  int64     `json:"revision"`
	SHA256    string    `json:"sha256"`
	Size      int64     `json:"size"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PublishedView is the outcome of publishing or deleting a domain.
type PublishedView struct {
	Domain DomainView `json:"domain"`
	// Edges maps each edge whose manifest advanced to its new sequence.
	Edges map[string]int64 `json:"edges"`
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
	mux.HandleFunc("GET "+AdminDomains, s.handle(s.listDomains))
	mux.HandleFunc("GET "+AdminDomains+"/{name}", s.handle(s.showDomain))
	mux.HandleFunc("PUT "+AdminDomains+"/{name}", s.handle(s.publishDomain))
	mux.HandleFunc("DELETE "+AdminDomains+"/{name}", s.handle(s.deleteDomain))
	mux.HandleFunc("POST "+AdminDomains+"/{name}/rollback", s.handle(s.rollbackDomain))
	mux.HandleFunc("POST "+AdminKeys+"/rotate", s.handle(s.rotateKey))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.o.AdminToken)) != 1 {
			msg := "admin bearer token required"
			if ok && got != "" {
				msg = "admin bearer token rejected"
			}
			s.log.Warn("security: admin request without the admin token", zap.String("remote", r.RemoteAddr),
				zap.String("path", r.URL.Path), zap.Bool("token_given", ok && got != ""))
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": msg})
			return
		}
		mux.ServeHTTP(w, r)
	})
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
