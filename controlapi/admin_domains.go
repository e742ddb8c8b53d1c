package controlapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/domain"
	"cellvisor/manifest"
)

func domainView(d store.Domain) adminapi.DomainView {
	return adminapi.DomainView{Name: d.Name, Pool: d.Pool, Revision: d.Revision, SHA256: d.SHA256, Size: d.Size, UpdatedAt: d.UpdatedAt}
}

func (s *Server) listDomains(w http.ResponseWriter, r *http.Request) error {
	ds, err := s.st.Domains(r.Context())
	if err != nil {
		return err
	}
	out := []adminapi.DomainView{}
	for _, d := range ds {
		out = append(out, domainView(d))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showDomain(w http.ResponseWriter, r *http.Request) error {
	// The move before the domain: a move's end and the revision it
	// publishes commit together, so a view that says the move is done
	// shows that revision (read the other way round, the move could end
	// between the two reads and the view pair "done" with the revision
	// before).
	m, merr := s.st.Move(r.Context(), r.PathValue("name"))
	d, err := s.st.Domain(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	if d.Deleted {
		return errorf(http.StatusNotFound, "domain %s was deleted", d.Name)
	}
	v := domainView(d)
	cells, err := s.servedCells(r.Context(), d.Name)
	if err != nil {
		return err
	}
	for _, c := range cells {
		v.Placements = append(v.Placements, adminapi.PlacementView{EdgeID: c.EdgeID, Cell: c.Cell, Pool: c.Pool, Role: c.Role})
	}
	if len(cells) > 0 {
		v.Cells = domainCells(cells, d.Revision)
	}
	if merr == nil {
		v.Move = moveView(m)
		if v.Move.WaitingFor, err = s.st.WaitingFor(r.Context(), m); err != nil {
			return err
		}
	} else if !errors.Is(merr, store.ErrNotFound) {
		return merr
	}
	writeJSON(w, http.StatusOK, v)
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
	var req adminapi.DomainRequest
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
	if err := refuseControlFields(&d); err != nil {
		return err
	}
	if d.TLS != nil && (d.TLS.Certificate != "" || d.TLS.ACME) {
		// The certificate's chain and fingerprint go into the artifact
		// (an ACME domain's once it has been issued one).
		if err := s.fillTLS(r.Context(), &d); err != nil {
			return err
		}
		d.Domain, d.Pool, d.Revision = "", "", 0
		if req.Config, err = json.Marshal(d); err != nil {
			return err
		}
	}
	start := time.Now()
	p, err := s.st.PublishDomain(r.Context(), name, req.Pool, d.Hostnames, func(rev int64) ([]byte, error) {
		_, data, err := domainArtifact(name, req.Pool, req.Config, rev)
		return data, err
	})
	s.metrics.Publish(time.Since(start))
	if errors.Is(err, store.ErrNotFound) {
		return errorf(http.StatusBadRequest, "pool: %q does not exist", req.Pool)
	}
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.kickACME()
	s.log.Info("domain published", zap.String("domain", name), zap.String("pool", req.Pool), zap.Int64("revision", p.Domain.Revision), zap.Int64("publish", p.Fanout), zap.Int("edges", p.Pending))
	for edge, why := range p.Skipped {
		s.log.Warn("domain not placed on an edge", zap.String("domain", name), zap.String("edge", edge), zap.String("reason", why))
	}
	writeJSON(w, http.StatusOK, publishedView(p))
	return nil
}

func publishedView(p store.Published) adminapi.PublishedView {
	v := adminapi.PublishedView{Domain: domainView(p.Domain), Edges: map[string]int64{}, Skipped: p.Skipped,
		Publish: p.Fanout, EdgesPending: p.Pending}
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
	s.log.Info("domain deleted", zap.String("domain", p.Domain.Name), zap.Int64("publish", p.Fanout), zap.Int("edges", p.Pending))
	writeJSON(w, http.StatusOK, publishedView(p))
	return nil
}
