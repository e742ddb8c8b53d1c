package controlapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/domain"
)

func poolView(p store.Pool) adminapi.PoolView {
	return adminapi.PoolView{Name: p.Name, Class: p.Class, Replicas: p.Replicas, Bound: p.Bound, MinReady: p.MinReady, Drain: p.Drain.String(),
		MaxConns: p.MaxConns, Rate: p.Rate, Burst: p.Burst, CreatedAt: p.CreatedAt}
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.st.Pools(r.Context())
	if err != nil {
		return err
	}
	out := []adminapi.PoolView{}
	for _, p := range ps {
		out = append(out, poolView(p))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// applyPool sets the fields req gives on p.
func applyPool(req adminapi.PoolRequest, p *store.Pool) error {
	for _, f := range []struct {
		v   *int
		dst *int
	}{{req.Replicas, &p.Replicas}, {req.Bound, &p.Bound}, {req.MinReady, &p.MinReady}, {req.MaxConns, &p.MaxConns}, {req.Rate, &p.Rate}, {req.Burst, &p.Burst}} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if req.Drain != nil {
		d, err := time.ParseDuration(*req.Drain)
		if err != nil {
			return errorf(http.StatusBadRequest, "drain: %q is not a duration (e.g. 30s, 5m)", *req.Drain)
		}
		p.Drain = d
	}
	return nil
}

func (s *Server) createPool(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.PoolRequest
	if err := decode(r, 4<<10, &req); err != nil {
		return err
	}
	class, ok := domain.PoolClass(req.Name)
	if !ok || len(req.Name) > 64 || !validName(req.Name, 64) {
		return errorf(http.StatusBadRequest, "name: %q: want shared-, reserved-, dedicated- or quarantine- and a name (lowercase, at most 64)", req.Name)
	}
	p := store.DefaultPool(req.Name, string(class))
	if err := applyPool(req, &p); err != nil {
		return err
	}
	p, err := s.st.CreatePool(r.Context(), p)
	if err != nil {
		return err
	}
	s.log.Info("pool created", zap.String("pool", p.Name), zap.Int("replicas", p.Replicas))
	writeJSON(w, http.StatusCreated, poolView(p))
	return nil
}

func (s *Server) showPool(w http.ResponseWriter, r *http.Request) error {
	p, err := s.st.Pool(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	v := poolView(p)
	cells, err := s.st.PoolCells(r.Context(), p.Name)
	if err != nil {
		return err
	}
	edges, err := s.st.Edges(r.Context())
	if err != nil {
		return err
	}
	for _, e := range edges {
		if cs, ok := cells[e.ID]; ok {
			v.Edges = append(v.Edges, poolHealth(p, e, cs))
		}
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

// poolHealth judges a pool's cells on an edge by its last status report.
func poolHealth(p store.Pool, e store.Edge, cells []string) adminapi.PoolHealth {
	h := adminapi.PoolHealth{Pool: p.Name, EdgeID: e.ID, EdgeName: e.Name, Cells: cells, MinReady: p.MinReady}
	h.Ready, h.Reported = store.ReadyCells(e.Status, p.Name)
	if h.Reported && h.Ready < p.MinReady {
		h.BelowMinimum = true
		h.Reason = fmt.Sprintf("%d of its %d cell(s) ready, minimum %d: new placements into it are refused on this edge", h.Ready, len(cells), p.MinReady)
	}
	return h
}

func (s *Server) updatePool(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.PoolRequest
	if err := decode(r, 4<<10, &req); err != nil {
		return err
	}
	if req.Name != "" || req.Replicas != nil {
		return errorf(http.StatusBadRequest, "a pool's name and replicas are set when it is created")
	}
	p, err := s.st.Pool(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	if err := applyPool(req, &p); err != nil {
		return err
	}
	p, edges, err := s.st.UpdatePool(r.Context(), p, s.sign)
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Info("pool updated", zap.String("pool", p.Name), zap.Int("edges", len(edges)))
	v := poolView(p)
	v.Sequences = sequences(edges)
	writeJSON(w, http.StatusOK, v)
	return nil
}

func sequences(es []store.EdgeSequence) map[string]int64 {
	out := map[string]int64{}
	for _, e := range es {
		out[e.EdgeID] = e.Sequence
	}
	return out
}

func (s *Server) deletePool(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if name == "shared-default" || name == "quarantine-default" {
		return errorf(http.StatusConflict, "pool %s is a default pool: edges assign it at first start", name)
	}
	if err := s.st.DeletePool(r.Context(), name); err != nil {
		return err
	}
	s.log.Info("pool deleted", zap.String("pool", name))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// edgeID resolves an edge's id or name.
func (s *Server) edgeID(ctx context.Context, idOrName string) (string, error) {
	if _, err := s.st.Edge(ctx, idOrName); err == nil {
		return idOrName, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	es, err := s.st.Edges(ctx)
	if err != nil {
		return "", err
	}
	for _, e := range es {
		if e.Name == idOrName {
			return e.ID, nil
		}
	}
	return "", fmt.Errorf("edge %s: %w", idOrName, store.ErrNotFound)
}

func (s *Server) assignCell(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.CellRequest
	if err := decode(r, 4<<10, &req); err != nil {
		return err
	}
	if _, ok := domain.PoolClass(req.Pool); !ok {
		return errorf(http.StatusBadRequest, "pool: %q is not a shared-, reserved-, dedicated- or quarantine- pool", req.Pool)
	}
	return s.setCell(w, r, req.Pool)
}

func (s *Server) unassignCell(w http.ResponseWriter, r *http.Request) error {
	return s.setCell(w, r, "")
}

func (s *Server) setCell(w http.ResponseWriter, r *http.Request, pool string) error {
	id, err := s.edgeID(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	cell := r.PathValue("cell")
	es, d, err := s.st.ChangeCell(r.Context(), id, cell, pool, s.o.MoveReadyWithin, s.sign)
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	out := adminapi.CellAssignment{EdgeID: id, Cell: cell, Pool: pool, Sequence: es.Sequence}
	if d != nil {
		s.nudgeMoves()
		s.log.Info("cell drain started", zap.String("edge", id), zap.String("cell", cell), zap.String("from", d.From), zap.String("to", pool),
			zap.Strings("domains", d.Domains), zap.Int64("sequence", es.Sequence))
		out.Drain = drainView(*d)
		writeJSON(w, http.StatusAccepted, out)
		return nil
	}
	s.log.Info("cell assignment changed", zap.String("edge", id), zap.String("cell", cell), zap.String("pool", pool), zap.Int64("sequence", es.Sequence))
	writeJSON(w, http.StatusOK, out)
	return nil
}

func drainView(d store.Drain) *adminapi.DrainView {
	return &adminapi.DrainView{Cell: d.Cell, From: d.From, To: d.To, State: d.State, Reason: d.Reason, Domains: d.Domains,
		StartedAt: d.StartedAt, Deadline: d.Deadline, DrainUntil: ptime(d.DrainUntil), Steps: d.Steps}
}

func moveView(m store.Move) *adminapi.MoveView {
	v := &adminapi.MoveView{Domain: m.Domain, From: m.From, To: m.To, State: m.State, Reason: m.Reason, StartedAt: m.StartedAt,
		Deadline: m.Deadline, DrainUntil: ptime(m.DrainUntil), Steps: m.Steps}
	return v
}

func (s *Server) startMove(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.MoveRequest
	if err := decode(r, 4<<10, &req); err != nil {
		return err
	}
	name := r.PathValue("name")
	m, edges, err := s.st.StartMove(r.Context(), name, req.To, s.o.MoveReadyWithin, s.sign)
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.nudgeMoves()
	s.log.Info("move started", zap.String("domain", name), zap.String("from", m.From), zap.String("to", m.To), zap.Int("edges", len(edges)))
	writeJSON(w, http.StatusAccepted, moveView(m))
	return nil
}

func (s *Server) cancelMove(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	m, err := s.st.CancelMove(r.Context(), name, s.sign)
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Info("move cancelled", zap.String("domain", name), zap.String("to", m.To))
	writeJSON(w, http.StatusOK, moveView(m))
	return nil
}
