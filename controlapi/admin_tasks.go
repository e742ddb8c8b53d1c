package controlapi

import (
	"net/http"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
)

func taskView(t store.Task) adminapi.TaskView {
	return adminapi.TaskView{ID: t.ID, EdgeID: t.EdgeID, Cell: t.Cell, Action: t.Action, State: t.State, Result: t.Result, CreatedAt: t.CreatedAt, DoneAt: ptime(t.DoneAt)}
}

func (s *Server) createTask(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.TaskRequest
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
	out := []adminapi.TaskView{}
	for _, t := range ts {
		out = append(out, taskView(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
