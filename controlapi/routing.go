package controlapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
)

// cellReport is a cell as its edge's last status report gives it.
type cellReport struct {
	State string
	// Sequence is the manifest sequence the cell confirmed it serves (0:
	// none).
	Sequence int64
	Port     int
}

// cellReports reads an edge's status report by cell: none when the edge
// has not reported, or its report does not decode.
func cellReports(status []byte) map[string]cellReport {
	var sum edgeapi.Summary
	if len(status) == 0 || json.Unmarshal(status, &sum) != nil {
		return nil
	}
	out := make(map[string]cellReport, len(sum.Slots))
	for _, c := range sum.Slots {
		out[c.Name] = cellReport{State: c.State, Sequence: c.Sequence, Port: c.HTTPPort}
	}
	return out
}

// servedCell is one cell of a domain (a placement), its edge, what the
// edge last reported of the cell, and the domain's revision it serves
// (0: none).
type servedCell struct {
	store.Placed
	edge     store.Edge
	report   cellReport
	revision int64
}

// servedCells reads a domain's placements, by edge and cell, with what
// each cell serves: the revision its confirmed sequence carries for it.
func (s *Server) servedCells(ctx context.Context, domain string) ([]servedCell, error) {
	ps, err := s.st.Placements(ctx, domain)
	if err != nil {
		return nil, fmt.Errorf("placements of %s: %w", domain, err)
	}
	spans, err := s.st.DomainSpans(ctx, domain)
	if err != nil {
		return nil, err
	}
	edges := map[string]store.Edge{}
	reports := map[string]map[string]cellReport{}
	var out []servedCell
	for _, p := range ps {
		e, ok := edges[p.EdgeID]
		if !ok {
			e, err = s.st.Edge(ctx, p.EdgeID)
			if errors.Is(err, store.ErrNotFound) {
				continue // deleted since, its placements with it
			}
			if err != nil {
				return nil, fmt.Errorf("cells of %s: %w", domain, err)
			}
			edges[p.EdgeID], reports[p.EdgeID] = e, cellReports(e.Status)
		}
		rep := reports[p.EdgeID][p.Cell]
		out = append(out, servedCell{Placed: p, edge: e, report: rep, revision: store.ServedRevision(spans, p.EdgeID, p.Cell, rep.Sequence)})
	}
	return out, nil
}

// routed is what the routing view lists of a domain's cells: the active
// ones their edge reported ready that serve the current revision; while
// none does (a publish on its way), the active ready ones that serve an
// earlier revision, so that a publish never empties what DNS would
// publish. A cell that serves no revision of the domain (one that has not
// applied it yet would answer 404) is never listed.
func routed(cells []servedCell, current int64) []servedCell {
	var now, earlier []servedCell
	for _, c := range cells {
		// Only what serves: a cell the edge reports degraded (a crash
		// backoff), drained, stopped, or has not reported at all, would
		// fail the requests a resolver sent it.
		if c.Role != store.RoleActive || c.report.State != "ready" || c.revision == 0 {
			continue
		}
		if c.revision == current {
			now = append(now, c)
		} else {
			earlier = append(earlier, c)
		}
	}
	if len(now) > 0 {
		return now
	}
	return earlier
}

// routing is the stand-in for DNS: the cells routed picks of a domain,
// with the address and port a resolver would hand out.
func (s *Server) routing(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	d, err := s.st.Domain(r.Context(), name)
	if err != nil {
		return err
	}
	if d.Deleted {
		return errorf(http.StatusNotFound, "domain %s was deleted", name)
	}
	cells, err := s.servedCells(r.Context(), name)
	if err != nil {
		return err
	}
	v := adminapi.RoutingView{Domain: name, Pool: d.Pool, Routes: []adminapi.Route{}}
	for _, c := range routed(cells, d.Revision) {
		rt := adminapi.Route{EdgeID: c.edge.ID, EdgeName: c.edge.Name, Cell: c.Cell, Address: c.edge.MgmtIPv4, Port: c.report.Port, Revision: c.revision}
		if rt.Address == "" {
			rt.Address = c.edge.MgmtIPv6
		}
		v.Routes = append(v.Routes, rt)
	}
	sort.Slice(v.Routes, func(i, j int) bool {
		a, b := v.Routes[i], v.Routes[j]
		return a.EdgeName+"/"+a.Cell < b.EdgeName+"/"+b.Cell
	})
	writeJSON(w, http.StatusOK, v)
	return nil
}

// domainCells is the domain show's view of a domain's cells, by edge name
// and cell.
func domainCells(cells []servedCell, current int64) []adminapi.DomainCell {
	out := make([]adminapi.DomainCell, 0, len(cells))
	for _, c := range cells {
		out = append(out, adminapi.DomainCell{EdgeID: c.EdgeID, EdgeName: c.edge.Name, Cell: c.Cell, Pool: c.Pool, Role: c.Role,
			State: c.report.State, Sequence: c.report.Sequence, Revision: c.revision, Current: c.revision != 0 && c.revision == current})
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.EdgeName < b.EdgeName || a.EdgeName == b.EdgeName && a.Cell < b.Cell
	})
	return out
}
