package controlapi

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
	"cellvisor/tlsseal"
)

// newToken makes a one-time bootstrap token: 256 random bits.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "cvt_" + base64.RawURLEncoding.EncodeToString(b), nil
}

func (s *Server) createEdge(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.EdgeRequest
	if err := decode(r, 64<<10, &req); err != nil {
		return err
	}
	if err := validateEdge(&req); err != nil {
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
		Assignments: InitialAssignments(req.Slots), Topology: edgeTopology(req),
	}, s.sign)
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Info("edge created", zap.String("edge", e.ID), zap.String("name", e.Name), zap.Int("slots", e.Slots))
	v := s.view(e, InitialAssignments(req.Slots))
	writeJSON(w, http.StatusCreated, adminapi.CreatedEdge{Edge: v, Token: token, TokenExpiresAt: expires, CA: s.ca.PEM})
	return nil
}

func (s *Server) listEdges(w http.ResponseWriter, r *http.Request) error {
	edges, err := s.st.Edges(r.Context())
	if err != nil {
		return err
	}
	out := []adminapi.EdgeView{}
	for _, e := range edges {
		out = append(out, s.view(e, nil))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showEdge(w http.ResponseWriter, r *http.Request) error {
	_, v, err := s.edgeDetail(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

// edgeDetail is one edge as edge show and its fleet page show it: its
// cells, pools, recent acks and tasks, and drains.
func (s *Server) edgeDetail(ctx context.Context, id string) (store.Edge, adminapi.EdgeView, error) {
	e, err := s.st.Edge(ctx, id)
	if err != nil {
		return store.Edge{}, adminapi.EdgeView{}, err
	}
	assign, err := s.st.Assignments(ctx, e.ID)
	if err != nil {
		return store.Edge{}, adminapi.EdgeView{}, err
	}
	v := s.view(e, assign)
	v.Status = e.Status
	if enc, err := s.st.EncryptionKey(ctx, e.ID); err != nil {
		return store.Edge{}, adminapi.EdgeView{}, err
	} else if pub, err := tlsseal.DecodePublic(enc); err == nil {
		v.EncryptionKeyID = tlsseal.KeyID(pub)
	} else {
		v.HTTPSKeys = "withheld: the edge has registered no encryption key"
	}
	byPool := map[string][]string{}
	for c, p := range assign {
		byPool[p] = append(byPool[p], c)
	}
	for _, name := range slices.Sorted(maps.Keys(byPool)) {
		p, err := s.st.Pool(ctx, name)
		if err != nil {
			return store.Edge{}, adminapi.EdgeView{}, err
		}
		cells := byPool[name]
		slices.Sort(cells)
		v.Pools = append(v.Pools, poolHealth(p, e, cells))
	}
	if v.Acks, err = s.st.Acks(ctx, e.ID, 20); err != nil {
		return store.Edge{}, adminapi.EdgeView{}, err
	}
	ts, err := s.st.Tasks(ctx, e.ID, false, 20)
	if err != nil {
		return store.Edge{}, adminapi.EdgeView{}, err
	}
	for _, t := range ts {
		v.Tasks = append(v.Tasks, taskView(t))
	}
	ds, err := s.st.Drains(ctx, e.ID)
	if err != nil {
		return store.Edge{}, adminapi.EdgeView{}, err
	}
	for _, d := range ds {
		dv := drainView(d)
		if dv.WaitingFor, err = s.st.DrainWaitingFor(ctx, d); err != nil {
			return store.Edge{}, adminapi.EdgeView{}, err
		}
		v.Drains = append(v.Drains, *dv)
	}
	return e, v, nil
}

func ptime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// view shows an edge, its cells and security events as it last reported.
func (s *Server) view(e store.Edge, assign map[string]string) adminapi.EdgeView {
	v := adminapi.EdgeView{
		ID: e.ID, Name: e.Name, Org: e.Org, Country: e.Country, Continent: e.Continent, MgmtIPv4: e.MgmtIPv4, MgmtIPv6: e.MgmtIPv6,
		Slots: e.Slots, Region: e.Region, Zone: e.Zone, Priority: e.Priority, CostTier: e.CostTier, Weight: e.Weight, Enrollment: adminapi.EnrollmentPending, EnrolledAt: ptime(e.EnrolledAt), Rotations: e.Rotations,
		LastSeen: ptime(e.LastSeen), Sequence: e.Sequence, ActiveSequence: e.ActiveSequence, Assignments: assign, StatusAt: ptime(e.StatusAt),
	}
	if e.Enrolled() {
		v.Enrollment = adminapi.EnrollmentEnrolled
		v.CertExpiresAt, v.RenewalPending = certExpiry(e.CertPEM), e.PendingSerial != ""
	} else {
		v.TokenExpiresAt = ptime(e.TokenExpiresAt)
	}
	if at := s.cache.lastSeen(e.ID); at.After(e.LastSeen) {
		v.LastSeen = &at // seen here, not yet written
	}
	var sum edgeapi.Summary
	if len(e.Status) > 0 && json.Unmarshal(e.Status, &sum) == nil {
		if r := sum.Runtime; r != nil {
			v.Runtime = &adminapi.RuntimeView{Version: r.Version, Superseded: r.Superseded, Upgrade: r.Upgrade, Reason: r.Reason}
		}
		for _, c := range sum.Slots {
			cv := adminapi.CellView{Name: c.Name, Pool: c.Pool, State: c.State, Reason: c.Reason, Drained: c.Drained, Sequence: c.Sequence}
			if r := c.Runtime; r != nil {
				cv.RuntimeVersion, cv.RuntimeSuperseded = r.Version, r.Superseded
			}
			v.Cells = append(v.Cells, cv)
			if c.Cell != nil && c.Cell.Security.AuthFailures > 0 {
				sec := adminapi.SecurityEvent{Cell: c.Name, AuthFailures: c.Cell.Security.AuthFailures, LastReason: c.Cell.Security.LastReason}
				if c.Cell.Security.LastAt > 0 {
					at := time.UnixMilli(int64(c.Cell.Security.LastAt * 1000)).UTC()
					sec.LastAt = &at
				}
				v.SecurityEvents = append(v.SecurityEvents, sec)
			}
			if c.Cell != nil && c.Cell.TLS.Count > 0 && c.Cell.TLS.Soonest != nil {
				v.Certificates = append(v.Certificates, adminapi.CellCertificates{Cell: c.Name, Count: c.Cell.TLS.Count,
					SoonestDomain: c.Cell.TLS.Soonest.Domain, SoonestExpiry: time.Unix(c.Cell.TLS.Soonest.NotAfter, 0).UTC()})
			}
		}
	}
	return v
}

func (s *Server) rotateEdge(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.RotateRequest
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
	writeJSON(w, http.StatusOK, adminapi.CreatedEdge{Edge: s.view(e, nil), Token: token, TokenExpiresAt: expires, CA: s.ca.PEM})
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
