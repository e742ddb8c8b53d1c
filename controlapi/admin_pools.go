package controlapi

import (
	"net/http"

	"cellvisor/domain"
)

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
