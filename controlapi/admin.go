package controlapi

import (
	"net/http"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/fleet"
	"cellvisor/controlapi/metrics"
)

// AdminHandler serves the admin API behind the bearer token.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+adminapi.PathCA, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-pem-file")
		w.Write([]byte(s.ca.PEM))
	})
	mux.HandleFunc("POST "+adminapi.PathEdges, s.handle(s.createEdge))
	mux.HandleFunc("GET "+adminapi.PathEdges, s.handle(s.listEdges))
	mux.HandleFunc("GET "+adminapi.PathEdges+"/{id}", s.handle(s.showEdge))
	mux.HandleFunc("POST "+adminapi.PathEdges+"/{id}/rotate", s.handle(s.rotateEdge))
	mux.HandleFunc("DELETE "+adminapi.PathEdges+"/{id}", s.handle(s.deleteEdge))
	mux.HandleFunc("POST "+adminapi.PathEdges+"/{id}/tasks", s.handle(s.createTask))
	mux.HandleFunc("GET "+adminapi.PathEdges+"/{id}/tasks", s.handle(s.listTasks))
	mux.HandleFunc("GET "+adminapi.PathPools, s.handle(s.listPools))
	mux.HandleFunc("POST "+adminapi.PathPools, s.handle(s.createPool))
	mux.HandleFunc("GET "+adminapi.PathPools+"/{name}", s.handle(s.showPool))
	mux.HandleFunc("PATCH "+adminapi.PathPools+"/{name}", s.handle(s.updatePool))
	mux.HandleFunc("DELETE "+adminapi.PathPools+"/{name}", s.handle(s.deletePool))
	mux.HandleFunc("PUT "+adminapi.PathEdges+"/{id}/cells/{cell}", s.handle(s.assignCell))
	mux.HandleFunc("DELETE "+adminapi.PathEdges+"/{id}/cells/{cell}", s.handle(s.unassignCell))
	mux.HandleFunc("POST "+adminapi.PathDomains+"/{name}/move", s.handle(s.startMove))
	mux.HandleFunc("DELETE "+adminapi.PathDomains+"/{name}/move", s.handle(s.cancelMove))
	mux.HandleFunc("GET "+adminapi.PathRouting+"/{name}", s.handle(s.routing))
	mux.HandleFunc("GET "+adminapi.PathDomains, s.handle(s.listDomains))
	mux.HandleFunc("GET "+adminapi.PathDomains+"/{name}", s.handle(s.showDomain))
	mux.HandleFunc("PUT "+adminapi.PathDomains+"/{name}", s.handle(s.publishDomain))
	mux.HandleFunc("DELETE "+adminapi.PathDomains+"/{name}", s.handle(s.deleteDomain))
	mux.HandleFunc("POST "+adminapi.PathDomains+"/{name}/rollback", s.handle(s.rollbackDomain))
	mux.HandleFunc("POST "+adminapi.PathKeys+"/rotate", s.handle(s.rotateKey))
	mux.HandleFunc("GET "+adminapi.PathCertificates, s.handle(s.listCertificates))
	mux.HandleFunc("GET "+adminapi.PathCertificates+"/{name}", s.handle(s.showCertificate))
	mux.HandleFunc("PUT "+adminapi.PathCertificates+"/{name}", s.handle(s.putCertificate))
	mux.HandleFunc("DELETE "+adminapi.PathCertificates+"/{name}", s.handle(s.deleteCertificate))
	mux.HandleFunc("PUT "+adminapi.PathEdges+"/{id}/frontdoor", s.handle(s.setFrontDoor))
	mux.HandleFunc("DELETE "+adminapi.PathEdges+"/{id}/frontdoor", s.handle(s.clearFrontDoor))
	mux.HandleFunc("GET "+adminapi.PathFrontDoors, s.handle(s.listFrontDoors))
	mux.HandleFunc("GET "+adminapi.PathFrontDoors+"/resolve", s.handle(s.resolveFrontDoor))
	s.egressAdminRoutes(mux)
	mux.Handle("GET "+PathMetrics, s.metrics.Handler())
	pages := s.fleet.Handler() // authenticates by itself: session cookie or bearer token
	return s.instrument(metrics.Admin, mux, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fleet.Handles(r.URL.Path) {
			pages.ServeHTTP(w, r)
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
