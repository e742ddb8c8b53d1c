package controlapi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
	"cellvisor/frontdoor"
)

func frontDoorView(g store.Gateway) adminapi.FrontDoorView {
	v := adminapi.FrontDoorView{URL: g.FrontDoorURL, EdgeID: g.EdgeID, Org: g.Org, Service: g.Service, Protocol: g.Protocol,
		Host: g.Host, Port: g.Port, TLS: g.TLS, MTLS: g.MTLS, Region: g.Region, Zone: g.Zone, Locality: g.Locality,
		Priority: g.Priority, CostTier: g.CostTier, Weight: g.Weight, RTTMicros: g.RTT.Microseconds(), Healthy: g.Healthy}
	if !g.LastSeen.IsZero() {
		t := g.LastSeen.UTC()
		v.LastSeen = &t
	}
	if !g.FrontDoorAt.IsZero() {
		t := g.FrontDoorAt.UTC()
		v.SetAt = &t
	}
	return v
}

// validService: 1-32 characters of a-z, 0-9 and '-'.
func validService(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func (s *Server) setFrontDoor(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.FrontDoorRequest
	if err := decode(r, 16<<10, &req); err != nil {
		return err
	}
	if req.Service == "" {
		req.Service = adminapi.DefaultFrontDoorService
	}
	if !validService(req.Service) {
		return errorf(http.StatusBadRequest, "service %q: want 1-32 characters of a-z, 0-9 and -", req.Service)
	}
	canon, err := frontdoor.Normalize(req.URL)
	if err != nil {
		return &apiError{Status: http.StatusBadRequest, Message: "url refused", Err: err}
	}
	id := r.PathValue("id")
	if !frontdoor.ValidEdge(id) {
		return errorf(http.StatusBadRequest, "edge id %q is not one the resolver accepts", id)
	}
	g, err := s.st.SetFrontDoor(r.Context(), id, req.Service, canon)
	if err != nil {
		return err
	}
	s.log.Info("front door set", zap.String("edge", id), zap.String("service", req.Service), zap.String("url", canon))
	writeJSON(w, http.StatusOK, frontDoorView(g))
	return nil
}

func (s *Server) clearFrontDoor(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if _, err := s.st.Edge(r.Context(), id); err != nil {
		return err
	}
	had, err := s.st.ClearFrontDoor(r.Context(), id)
	if err != nil {
		return err
	}
	if !had {
		return errorf(http.StatusNotFound, "edge %s has no front door", id)
	}
	s.log.Info("front door cleared", zap.String("edge", id))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listFrontDoors(w http.ResponseWriter, r *http.Request) error {
	gws, err := s.st.FrontDoors(r.Context(), r.URL.Query().Get("org"))
	if err != nil {
		return err
	}
	out := []adminapi.FrontDoorView{}
	for _, g := range gws {
		out = append(out, frontDoorView(g))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// reasonStatus is the HTTP status of a refusal.
func reasonStatus(r frontdoor.Reason) int {
	switch r {
	case frontdoor.Malformed:
		return http.StatusBadRequest
	case frontdoor.Unmapped:
		return http.StatusNotFound
	default: // ambiguous, corrupt_row: the rows are at fault, not the input
		return http.StatusConflict
	}
}

func (s *Server) resolveFrontDoor(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	raw, org := q.Get("url"), q.Get("org")
	gws, err := s.st.FrontDoors(r.Context(), org)
	if err != nil {
		return err
	}
	rows := make([]frontdoor.Row, 0, len(gws))
	orgOf := map[string]string{}
	for _, g := range gws {
		rows = append(rows, frontdoor.Row{Edge: g.EdgeID, URL: g.FrontDoorURL})
		orgOf[g.EdgeID] = g.Org
	}
	v := adminapi.ResolveView{URL: raw}
	v.Canonical, _ = frontdoor.Normalize(raw)
	edge, err := frontdoor.Resolve(raw, rows)
	if err != nil {
		var ref *frontdoor.Refusal
		if !errors.As(err, &ref) {
			return err
		}
		reason := ref.Reason
		v.Reason, v.Error = string(reason), ref.Detail
		s.log.Info("front door resolve refused", zap.String("url", raw), zap.String("reason", string(reason)), zap.Error(err))
		writeJSON(w, reasonStatus(reason), v)
		return nil
	}
	v.EdgeID, v.Org = edge, orgOf[edge]
	writeJSON(w, http.StatusOK, v)
	return nil
}

// edgeFrontDoors serves the front doors of the edge's org, 304 when the
// agent's ETag (a digest of the answer) still holds. Rows are checked
// before they leave: a corrupt row is sent as it is, and the cells refuse
// it (corrupt_row), but it is logged here.
func (s *Server) edgeFrontDoors(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	org, err := s.st.EdgeOrg(r.Context(), st.ID)
	if err != nil {
		return err
	}
	gws, err := s.st.FrontDoors(r.Context(), org)
	if err != nil {
		return err
	}
	out := edgeapi.FrontDoors{Org: org, Rows: []edgeapi.FrontDoorRow{}}
	for _, g := range gws {
		row := frontdoor.Row{Edge: g.EdgeID, URL: g.FrontDoorURL}
		if err := frontdoor.CheckRow(row); err != nil {
			s.log.Error("corrupt front-door row", zap.String("edge", g.EdgeID), zap.String("service", g.Service), zap.Error(err))
		}
		out.Rows = append(out.Rows, edgeapi.FrontDoorRow{Edge: g.EdgeID, URL: g.FrontDoorURL})
	}
	data, err := json.Marshal(out)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	tag := `"` + hex.EncodeToString(sum[:16]) + `"`
	w.Header().Set("ETag", tag)
	if r.Header.Get("If-None-Match") == tag {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(data, '\n'))
	return nil
}

// validGateways checks what an agent reports before it is stored.
func validGateways(gws []edgeapi.Gateway) error {
	if len(gws) > edgeapi.MaxGateways {
		return errorf(http.StatusBadRequest, "gateways: %d, at most %d", len(gws), edgeapi.MaxGateways)
	}
	seen := map[string]bool{}
	for _, g := range gws {
		switch {
		case !validService(g.Service) || seen[g.Service]:
			return errorf(http.StatusBadRequest, "gateway service %q: invalid or repeated", g.Service)
		case g.Port < 0 || g.Port > 65535 || g.RTTMicros < 0:
			return errorf(http.StatusBadRequest, "gateway %s: port or rtt out of range", g.Service)
		case len(g.Protocol) > 16 || len(g.Host) > 255 || len(g.Region) > 64 || len(g.Zone) > 64 || len(g.Locality) > 64:
			return errorf(http.StatusBadRequest, "gateway %s: a field is too long", g.Service)
		}
		seen[g.Service] = true
	}
	return nil
}

// syncGateways stores an agent's reported gateways (never a front door).
// gatewayRows are a status report's gateways as the store syncs them.
func gatewayRows(gws []edgeapi.Gateway) []store.Gateway {
	rows := make([]store.Gateway, 0, len(gws))
	for _, g := range gws {
		rows = append(rows, store.Gateway{Service: g.Service, Protocol: g.Protocol, Host: g.Host, Port: g.Port, TLS: g.TLS,
			MTLS: g.MTLS, Region: g.Region, Zone: g.Zone, Locality: g.Locality, Priority: g.Priority, CostTier: g.CostTier,
			Weight: g.Weight, RTT: time.Duration(g.RTTMicros) * time.Microsecond, Healthy: g.Healthy})
	}
	return rows
}
