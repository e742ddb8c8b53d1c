package controlapi

import (
	"errors"
	"net/http"
	"net/url"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
	"cellvisor/egress"
)

// maxRank bounds priority, cost tier and weight.
const maxRank = 65535

// applyTopology validates u and applies it to t.
func applyTopology(u adminapi.EdgeUpdateRequest, t *store.Topology) error {
	for _, f := range []struct {
		name string
		v    *string
		to   *string
	}{{"region", u.Region, &t.Region}, {"zone", u.Zone, &t.Zone}} {
		if f.v == nil {
			continue
		}
		if *f.v != "" && !validName(*f.v, 63) {
			return errorf(http.StatusBadRequest, "%s: %q: want 1–63 lowercase letters, digits, '-' or '.', or empty", f.name, *f.v)
		}
		*f.to = *f.v
	}
	for _, f := range []struct {
		name string
		v    *int
		to   *int
	}{{"priority", u.Priority, &t.Priority}, {"cost_tier", u.CostTier, &t.CostTier}, {"weight", u.Weight, &t.Weight}} {
		if f.v == nil {
			continue
		}
		if *f.v < 0 || *f.v > maxRank {
			return errorf(http.StatusBadRequest, "%s: %d: want 0–%d", f.name, *f.v, maxRank)
		}
		*f.to = *f.v
	}
	return nil
}

func (s *Server) egressAdminRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PATCH "+adminapi.PathEdges+"/{id}", s.handle(s.updateEdge))
	mux.HandleFunc("GET "+adminapi.PathEgress+"/policies", s.handle(s.listEgressPolicies))
	mux.HandleFunc("GET "+adminapi.PathEgress+"/policies/{org}/{class}", s.handle(s.showEgressPolicy))
	mux.HandleFunc("PUT "+adminapi.PathEgress+"/policies/{org}/{class}", s.handle(s.setEgressPolicy))
	mux.HandleFunc("DELETE "+adminapi.PathEgress+"/policies/{org}/{class}", s.handle(s.clearEgressPolicy))
	mux.HandleFunc("GET "+adminapi.PathEgress+"/leases", s.handle(s.listLeases))
}

func (s *Server) updateEdge(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.EdgeUpdateRequest
	if err := decode(r, 64<<10, &req); err != nil {
		return err
	}
	e, err := s.st.Edge(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	t := e.Topology
	if err := applyTopology(req, &t); err != nil {
		return err
	}
	if err := s.st.SetTopology(r.Context(), e.ID, t); err != nil {
		return err
	}
	s.log.Info("edge topology set", zap.String("edge", e.ID), zap.String("region", t.Region), zap.String("zone", t.Zone),
		zap.Int("priority", t.Priority), zap.Int("cost_tier", t.CostTier), zap.Int("weight", t.Weight))
	e.Topology = t
	writeJSON(w, http.StatusOK, s.view(e, nil))
	return nil
}

// scope reads and checks {org} and {class}.
func scope(r *http.Request) (org string, class egress.Class, err error) {
	org = r.PathValue("org")
	if !validName(org, 63) {
		return "", "", errorf(http.StatusBadRequest, "org %q: want 1–63 lowercase letters, digits, '-' or '.'", org)
	}
	if class, err = egress.ParseClass(r.PathValue("class")); err != nil {
		return "", "", errorf(http.StatusBadRequest, "%v (want one of %v)", err, egress.Classes)
	}
	return org, class, nil
}

func policyView(p store.EgressPolicy) adminapi.EgressPolicyView {
	return adminapi.EgressPolicyView{Org: p.Org, Class: p.Class, Destination: p.Destination, Region: p.Region,
		Require: edgeapi.Requirement{Region: p.RequireRegion, Zone: p.RequireZone}, UpdatedAt: p.UpdatedAt}
}

func (s *Server) setEgressPolicy(w http.ResponseWriter, r *http.Request) error {
	org, class, err := scope(r)
	if err != nil {
		return err
	}
	var req adminapi.EgressPolicyRequest
	if err := decode(r, 16<<10, &req); err != nil {
		return err
	}
	u, err := url.Parse(req.Destination)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(req.Destination) > maxEgressURL || u.User != nil {
		return errorf(http.StatusBadRequest, "destination %q: want an http:// or https:// URL with a host, no credentials, at most %d bytes",
			trunc(req.Destination), maxEgressURL)
	}
	for _, f := range []struct{ name, v string }{{"region", req.Region}, {"require.region", req.Require.Region}, {"require.zone", req.Require.Zone}} {
		if f.v != "" && !validName(f.v, 63) {
			return errorf(http.StatusBadRequest, "%s: %q: want 1–63 lowercase letters, digits, '-' or '.', or empty", f.name, f.v)
		}
	}
	p := store.EgressPolicy{Org: org, Class: string(class), Destination: req.Destination, Region: req.Region,
		RequireRegion: req.Require.Region, RequireZone: req.Require.Zone, UpdatedAt: s.o.Now().UTC().Truncate(time.Millisecond)}
	if err := s.st.PutEgressPolicy(r.Context(), p); err != nil {
		return err
	}
	s.log.Info("egress policy set", zap.String("org", org), zap.String("class", string(class)), zap.String("destination", p.Destination),
		zap.String("region", p.Region), zap.String("require_region", p.RequireRegion), zap.String("require_zone", p.RequireZone))
	writeJSON(w, http.StatusOK, policyView(p))
	return nil
}

func (s *Server) showEgressPolicy(w http.ResponseWriter, r *http.Request) error {
	org, class, err := scope(r)
	if err != nil {
		return err
	}
	p, err := s.st.EgressPolicyFor(r.Context(), org, string(class))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, policyView(p))
	return nil
}

func (s *Server) listEgressPolicies(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.st.EgressPolicies(r.Context(), r.URL.Query().Get("org"))
	if err != nil {
		return err
	}
	out := []adminapi.EgressPolicyView{}
	for _, p := range ps {
		out = append(out, policyView(p))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) clearEgressPolicy(w http.ResponseWriter, r *http.Request) error {
	org, class, err := scope(r)
	if err != nil {
		return err
	}
	p, err := s.st.EgressPolicyFor(r.Context(), org, string(class))
	if err != nil {
		return err
	}
	if err := s.st.DeleteEgressPolicy(r.Context(), org, string(class)); err != nil {
		return err
	}
	s.log.Info("egress policy cleared: the class is refused until set again", zap.String("org", org), zap.String("class", string(class)))
	writeJSON(w, http.StatusOK, policyView(p))
	return nil
}

func (s *Server) listLeases(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.st.ActiveLeases(r.Context(), r.URL.Query().Get("org"))
	if err != nil {
		return err
	}
	now := s.o.Now()
	out := []adminapi.LeaseView{}
	for _, l := range ls {
		v := adminapi.LeaseView{Org: l.Org, Class: l.Class, Holder: l.Holder, Epoch: l.Epoch, AcquiredAt: l.AcquiredAt, ExpiresAt: l.ExpiresAt,
			Expired: !now.Before(l.ExpiresAt)}
		e, err := s.st.Edge(r.Context(), l.Holder)
		switch {
		case err == nil:
			v.HolderName, v.Region = e.Name, e.Region
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// edgeTopology is a new edge's: the defaults with what the request sets.
func edgeTopology(r adminapi.EdgeRequest) store.Topology {
	t := store.DefaultTopology
	applyTopology(r.EdgeUpdateRequest, &t) //nolint:errcheck // validateEdge checked it
	return t
}
