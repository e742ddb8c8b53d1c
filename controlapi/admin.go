package controlapi

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"cellvisor/controlapi/store"
	"cellvisor/domain"
	"cellvisor/edgeapi"
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
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.o.AdminToken)) != 1 {
			s.log.Warn("security: admin request without the admin token", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "admin bearer token required"})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// newToken makes a one-time bootstrap token: 256 random bits.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "cvt_" + base64.RawURLEncoding.EncodeToString(b), nil
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

func (s *Server) createEdge(w http.ResponseWriter, r *http.Request) error {
	var req EdgeRequest
	if err := decode(r, 64<<10, &req); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	ttl, err := tokenTTL("token_ttl", req.TokenTTL)
	if err != nil {
		return err
	}
	token, err := newToken()
	if err != nil {
		return err
	}
	expires := s.o.Now().Add(ttl).UTC().Truncate(time.Millisecond)
	e, err := s.st.CreateEdge(r.Context(), store.NewEdge{
		ID: uuid.NewString(), Name: req.Name, Org: req.Org, Country: req.Country, Continent: req.Continent,
		MgmtIPv4: req.MgmtIPv4, MgmtIPv6: req.MgmtIPv6, Slots: req.Slots, TokenHash: hashToken(token), TokenExpiresAt: expires,
		Assignments: InitialAssignments(req.Slots),
	}, s.sign)
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Info("edge created", zap.String("edge", e.ID), zap.String("name", e.Name), zap.Int("slots", e.Slots))
	v := s.view(e, InitialAssignments(req.Slots))
	writeJSON(w, http.StatusCreated, CreatedEdge{Edge: v, Token: token, TokenExpiresAt: expires, CA: s.ca.PEM})
	return nil
}

func (s *Server) listEdges(w http.ResponseWriter, r *http.Request) error {
	edges, err := s.st.Edges(r.Context())
	if err != nil {
		return err
	}
	out := []EdgeView{}
	for _, e := range edges {
		out = append(out, s.view(e, nil))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showEdge(w http.ResponseWriter, r *http.Request) error {
	e, err := s.st.Edge(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	assign, err := s.st.Assignments(r.Context(), e.ID)
	if err != nil {
		return err
	}
	v := s.view(e, assign)
	v.Status = e.Status
	if v.Acks, err = s.st.Acks(r.Context(), e.ID, 20); err != nil {
		return err
	}
	ts, err := s.st.Tasks(r.Context(), e.ID, false, 20)
	if err != nil {
		return err
	}
	for _, t := range ts {
		v.Tasks = append(v.Tasks, taskView(t))
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func ptime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// view shows an edge, its cells and security events as it last reported.
func (s *Server) view(e store.Edge, assign map[string]string) EdgeView {
	v := EdgeView{
		ID: e.ID, Name: e.Name, Org: e.Org, Country: e.Country, Continent: e.Continent, MgmtIPv4: e.MgmtIPv4, MgmtIPv6: e.MgmtIPv6,
		Slots: e.Slots, Enrollment: EnrollmentPending, EnrolledAt: ptime(e.EnrolledAt), Rotations: e.Rotations,
		LastSeen: ptime(e.LastSeen), Sequence: e.Sequence, ActiveSequence: e.ActiveSequence, Assignments: assign, StatusAt: ptime(e.StatusAt),
	}
	if e.Enrolled() {
		v.Enrollment = EnrollmentEnrolled
		v.CertExpiresAt, v.RenewalPending = certExpiry(e.CertPEM), e.PendingSerial != ""
	} else {
		v.TokenExpiresAt = ptime(e.TokenExpiresAt)
	}
	if at := s.cache.lastSeen(e.ID); at.After(e.LastSeen) {
		v.LastSeen = &at // seen here, not yet written
	}
	var sum edgeapi.Summary
	if len(e.Status) > 0 && json.Unmarshal(e.Status, &sum) == nil {
		for _, c := range sum.Slots {
			v.Cells = append(v.Cells, CellView{Name: c.Name, Pool: c.Pool, State: c.State, Reason: c.Reason, Drained: c.Drained, Sequence: c.Sequence})
			if c.Cell != nil && c.Cell.Security.AuthFailures > 0 {
				sec := SecurityEvent{Cell: c.Name, AuthFailures: c.Cell.Security.AuthFailures, LastReason: c.Cell.Security.LastReason}
				if c.Cell.Security.LastAt > 0 {
					at := time.UnixMilli(int64(c.Cell.Security.LastAt * 1000)).UTC()
					sec.LastAt = &at
				}
				v.SecurityEvents = append(v.SecurityEvents, sec)
			}
		}
	}
	return v
}

func (s *Server) rotateEdge(w http.ResponseWriter, r *http.Request) error {
	var req RotateRequest
	if r.ContentLength != 0 {
		if err := decode(r, 64<<10, &req); err != nil {
			return err
		}
	}
	ttl, err := tokenTTL("token_ttl", req.TokenTTL)
	if err != nil {
		return err
	}
	token, err := newToken()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	expires := s.o.Now().Add(ttl).UTC().Truncate(time.Millisecond)
	if err := s.st.Rotate(r.Context(), id, hashToken(token), expires); err != nil {
		return err
	}
	s.refresh(r.Context())
	e, err := s.st.Edge(r.Context(), id)
	if err != nil {
		return err
	}
	s.log.Info("edge identity rotated: its certificate is refused from now on", zap.String("edge", id))
	writeJSON(w, http.StatusOK, CreatedEdge{Edge: s.view(e, nil), Token: token, TokenExpiresAt: expires, CA: s.ca.PEM})
	return nil
}

// deleteEdge removes an edge (a host retired): its certificate is refused
// from then on, by every replica once its cache catches up, and its
// manifests, acks and tasks go with it.
func (s *Server) deleteEdge(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	e, err := s.st.Edge(r.Context(), id)
	if err != nil {
		return err
	}
	if err := s.st.DeleteEdge(r.Context(), id); err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Info("edge deleted: its certificate is refused from now on", zap.String("edge", id), zap.String("name", e.Name))
	writeJSON(w, http.StatusOK, s.view(e, nil))
	return nil
}

func taskView(t store.Task) TaskView {
	return TaskView{ID: t.ID, EdgeID: t.EdgeID, Cell: t.Cell, Action: t.Action, State: t.State, Result: t.Result, CreatedAt: t.CreatedAt, DoneAt: ptime(t.DoneAt)}
}

func (s *Server) createTask(w http.ResponseWriter, r *http.Request) error {
	var req TaskRequest
	if err := decode(r, 4<<10, &req); err != nil {
		return err
	}
	e, err := s.st.Edge(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	switch {
	case !edgeapi.ValidAction(req.Action):
		return errorf(http.StatusBadRequest, "action: %q: want drain, undrain or restart", req.Action)
	case !validCell(req.Cell, e.Slots):
		return errorf(http.StatusBadRequest, "cell: %q: edge %s has cell-01 to cell-%02d", req.Cell, e.Name, e.Slots)
	}
	t, err := s.st.CreateTask(r.Context(), e.ID, req.Cell, req.Action)
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Info("task created", zap.String("edge", e.ID), zap.Int64("task", t.ID), zap.String("cell", t.Cell), zap.String("action", t.Action))
	writeJSON(w, http.StatusCreated, taskView(t))
	return nil
}

func (s *Server) listTasks(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.st.Edge(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	ts, err := s.st.Tasks(r.Context(), r.PathValue("id"), r.URL.Query().Get("state") == "pending", 100)
	if err != nil {
		return err
	}
	out := []TaskView{}
	for _, t := range ts {
		out = append(out, taskView(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.st.Pools(r.Context())
	if err != nil {
		return err
	}
	out := []PoolView{}
	for _, p := range ps {
		out = append(out, PoolView{Name: p.Name, Class: p.Class, CreatedAt: p.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createPool(w http.ResponseWriter, r *http.Request) error {
	var req PoolRequest
	if err := decode(r, 4<<10, &req); err != nil {
		return err
	}
	class, ok := domain.PoolClass(req.Name)
	if !ok || len(req.Name) > 64 || !validName(req.Name, 64) {
		return errorf(http.StatusBadRequest, "name: %q: want shared-, reserved-, dedicated- or quarantine- and a name (lowercase, at most 64)", req.Name)
	}
	p, err := s.st.CreatePool(r.Context(), req.Name, string(class))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, PoolView{Name: p.Name, Class: p.Class, CreatedAt: p.CreatedAt})
	return nil
}

func domainView(d store.Domain) DomainView {
	return DomainView{Name: d.Name, Pool: d.Pool, Revision: d.Revision, SHA256: d.SHA256, Size: d.Size, UpdatedAt: d.UpdatedAt}
}

func (s *Server) listDomains(w http.ResponseWriter, r *http.Request) error {
	ds, err := s.st.Domains(r.Context())
	if err != nil {
		return err
	}
	out := []DomainView{}
	for _, d := range ds {
		out = append(out, domainView(d))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showDomain(w http.ResponseWriter, r *http.Request) error {
	d, err := s.st.Domain(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	if d.Deleted {
		return errorf(http.StatusNotFound, "domain %s was deleted", d.Name)
	}
	writeJSON(w, http.StatusOK, domainView(d))
	return nil
}

// domainArtifact makes a domain revision's artifact from the admin's
// configuration: strictly decoded, its domain, pool and revision set by the
// control plane, validated exactly as an edge will, canonically encoded.
func domainArtifact(name, pool string, config []byte, revision int64) (domain.Domain, []byte, error) {
	var d domain.Domain
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return d, nil, errorf(http.StatusBadRequest, "config: %v", err)
	}
	switch {
	case d.Domain != "" && d.Domain != name:
		return d, nil, errorf(http.StatusBadRequest, "config: domain %q, the path says %q", d.Domain, name)
	case d.Pool != "" && d.Pool != pool:
		return d, nil, errorf(http.StatusBadRequest, "config: pool %q, the request says %q", d.Pool, pool)
	}
	d.Domain, d.Pool, d.Revision = name, pool, revision
	data, err := json.Marshal(d)
	if err != nil {
		return d, nil, err
	}
	if d, err = domain.Decode(data); err != nil {
		return d, nil, errorf(http.StatusBadRequest, "config: %v", err)
	}
	if len(data) > manifest.MaxArtifactBytes {
		return d, nil, errorf(http.StatusRequestEntityTooLarge, "config: %d bytes, at most %d", len(data), manifest.MaxArtifactBytes)
	}
	return d, data, nil
}

func (s *Server) publishDomain(w http.ResponseWriter, r *http.Request) error {
	var req DomainRequest
	if err := decode(r, 2*manifest.MaxArtifactBytes, &req); err != nil {
		return err
	}
	name := r.PathValue("name")
	if _, ok := domain.PoolClass(req.Pool); !ok {
		return errorf(http.StatusBadRequest, "pool: %q is not a shared-, reserved-, dedicated- or quarantine- pool", req.Pool)
	}
	d, _, err := domainArtifact(name, req.Pool, req.Config, 1)
	if err != nil {
		return err // refused before anything is written
	}
	p, err := s.st.PublishDomain(r.Context(), name, req.Pool, d.Hostnames, func(rev int64) ([]byte, error) {
		_, data, err := domainArtifact(name, req.Pool, req.Config, rev)
		return data, err
	}, s.sign)
	if errors.Is(err, store.ErrNotFound) {
		return errorf(http.StatusBadRequest, "pool: %q does not exist", req.Pool)
	}
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Info("domain published", zap.String("domain", name), zap.String("pool", req.Pool), zap.Int64("revision", p.Domain.Revision), zap.Int("edges", len(p.Edges)))
	writeJSON(w, http.StatusOK, publishedView(p))
	return nil
}

func publishedView(p store.Published) PublishedView {
	v := PublishedView{Domain: domainView(p.Domain), Edges: map[string]int64{}}
	for _, e := range p.Edges {
		v.Edges[e.EdgeID] = e.Sequence
	}
	return v
}

func (s *Server) deleteDomain(w http.ResponseWriter, r *http.Request) error {
	p, err := s.st.DeleteDomain(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Info("domain deleted", zap.String("domain", p.Domain.Name), zap.Int("edges", len(p.Edges)))
	writeJSON(w, http.StatusOK, publishedView(p))
	return nil
}
