package controlapi

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/manifest"
)

// The fleet page: server-rendered HTML on the admin listener, for
// operators: every edge with its cells, the failing moves, the egress
// holders and the recent refusals, and a page per edge. No JavaScript and
// no external assets; everything shown is escaped by html/template (edge
// names, cell names and reasons come from agents and are treated as
// hostile). See docs/control.md.

// Fleet page paths, on the admin listener.
const (
	FleetPath   = "/fleet"
	FleetLogin  = FleetPath + "/login"
	FleetLogout = FleetPath + "/logout"
	FleetEdges  = FleetPath + "/edges"
	FleetStyle  = FleetPath + "/style.css"
)

const (
	// SilentAfter is how long an enrolled edge may go unseen (no poll, no
	// status report) before the fleet page marks it silent. An agent
	// reports its status every 15 s by default and backs off to at most
	// 2 minutes while the control API is unreachable.
	SilentAfter = 2 * time.Minute
	// FleetPageSize is the number of edges on a fleet page, unless ?limit
	// asks for another (up to FleetPageMax).
	FleetPageSize = 200
	FleetPageMax  = 1000
	// fleetRecent bounds the refusals, failing moves, acks and tasks shown.
	fleetRecent = 20
)

//go:embed fleet_templates
var fleetFiles embed.FS

var fleetTemplates = template.Must(template.New("fleet").Funcs(template.FuncMap{
	"ts":         func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"clip":       clip,
	"stateClass": stateClass,
}).ParseFS(fleetFiles, "fleet_templates/*.html"))

// clip shortens agent-supplied text that could be long, so that one edge
// cannot blow up the page.
func clip(s string) string {
	const max = 300
	if r := []rune(s); len(r) > max {
		return string(r[:max]) + "…"
	}
	return s
}

// stateClass is the style class of a cell's state: one of a fixed set,
// whatever the agent reported.
func stateClass(state string, drained bool) string {
	switch {
	case drained:
		return "state-drained"
	case state == "ready", state == "degraded", state == "drained", state == "stopped":
		return "state-" + state
	}
	return "state-other"
}

// fleetHandler serves the fleet page, its sign-in and its style sheet. It
// authenticates by itself (a session cookie or the bearer token): the
// admin API's bearer check is not in front of it.
func (s *Server) fleetHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+FleetStyle, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, fleetFiles, "fleet_templates/style.css")
	})
	mux.HandleFunc("GET "+FleetLogin, s.loginForm)
	mux.HandleFunc("POST "+FleetLogin, s.login)
	mux.HandleFunc("POST "+FleetLogout, s.logout)
	mux.HandleFunc("GET "+FleetPath, s.requireSession(s.fleetPage))
	mux.HandleFunc("GET "+FleetEdges+"/{id}", s.requireSession(s.edgePage))
	// Cross-origin POSTs (a sign-in or sign-out forged by another site)
	// are refused from the browser's Sec-Fetch-Site and Origin headers;
	// the session cookie is SameSite=Strict besides.
	return http.NewCrossOriginProtection().Handler(mux)
}

// isFleetPath reports a path the fleet handler serves.
func isFleetPath(p string) bool {
	return p == FleetPath || len(p) > len(FleetPath) && p[:len(FleetPath)+1] == FleetPath+"/"
}

type loginPage struct{ Error string }

// EgressHolder is the edge holding the egress lease of one (org, traffic
// class), at its fencing epoch, until its expiry unless renewed.
type EgressHolder struct {
	Org, Class, EdgeID, EdgeName, Region string
	Epoch                                int64
	Until                                time.Time
}

// egressHolders returns the current egress lease holders, up to
// FleetPageMax, and how many there are: a lease past its expiry is
// nobody's, and is not shown.
func (s *Server) egressHolders(ctx context.Context) ([]EgressHolder, int, error) {
	ls, total, err := s.st.HeldLeases(ctx, s.o.Now(), FleetPageMax)
	if err != nil {
		return nil, 0, err
	}
	out := make([]EgressHolder, 0, len(ls))
	for _, l := range ls {
		out = append(out, EgressHolder{Org: l.Org, Class: l.Class, EdgeID: l.Holder, EdgeName: l.HolderName,
			Region: regionZone(l.Region, l.Zone), Epoch: l.Epoch, Until: l.ExpiresAt})
	}
	return out, total, nil
}

// edgeRegion is the edge's region and zone: the page shows the column
// only when some edge has one.
func edgeRegion(e store.Edge) string { return regionZone(e.Region, e.Zone) }

func regionZone(region, zone string) string {
	switch {
	case zone == "":
		return region
	case region == "":
		return zone
	}
	return region + " / " + zone
}

// fleetEdge is an edge as the fleet page shows it.
type fleetEdge struct {
	adminapi.EdgeView
	Region string
	// Silent marks an enrolled edge unseen for SilentAfter or never seen.
	Silent bool
	// Ago is how long ago it was last seen, rounded.
	Ago string
	// Lagging says the edge has not applied its newest sequence.
	Lagging bool
	// Unassigned counts its cells with no pool that are stopped: listed
	// on the edge's page only.
	Unassigned int
	Shown      []adminapi.CellView
}

func (s *Server) fleetEdge(e store.Edge, assign map[string]string, now time.Time) fleetEdge {
	f := fleetEdge{EdgeView: s.view(e, assign), Region: edgeRegion(e)}
	f.Lagging = f.ActiveSequence < f.Sequence
	if f.LastSeen != nil {
		f.Ago = ago(now.Sub(*f.LastSeen))
	}
	f.Silent = f.Enrollment == adminapi.EnrollmentEnrolled && (f.LastSeen == nil || now.Sub(*f.LastSeen) > SilentAfter)
	for _, c := range f.Cells {
		if c.Pool == "" && c.State == "stopped" {
			f.Unassigned++
			continue
		}
		f.Shown = append(f.Shown, c)
	}
	return f
}

// ago says a duration the way a person reads it at a glance.
func ago(d time.Duration) string {
	switch {
	case d < 0:
		return "just now" // a clock ahead of ours
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h ago"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d ago"
}

type fleetPage struct {
	Now         time.Time
	SilentAfter time.Duration
	Total       int
	Silent      int
	Edges       []fleetEdge
	ShowRegion  bool
	SilentOnly  bool
	// Next is the next page's address, empty on the last page.
	Next         string
	Paged        bool
	FailingMoves []adminapi.MoveView
	Egress       []EgressHolder
	EgressTotal  int
	Refusals     []store.EdgeAck
}

func (s *Server) fleetPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := FleetPageSize
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > FleetPageMax {
			http.Error(w, "limit: want 1–"+strconv.Itoa(FleetPageMax), http.StatusBadRequest)
			return
		}
		limit = n
	}
	now := s.o.Now()
	p := fleetPage{Now: now, SilentAfter: SilentAfter, SilentOnly: q.Get("silent") == "1", Paged: q.Get("after") != ""}
	f := store.EdgeFilter{After: q.Get("after"), Limit: limit + 1}
	if p.SilentOnly {
		f.SilentBefore = now.Add(-SilentAfter)
	}
	err := func() error {
		ctx := r.Context()
		var err error
		if p.Total, err = s.st.CountEdges(ctx); err != nil {
			return err
		}
		silent, err := s.st.SilentEdges(ctx, now.Add(-SilentAfter))
		if err != nil {
			return err
		}
		for _, id := range silent {
			if now.Sub(s.cache.lastSeen(id)) > SilentAfter {
				p.Silent++ // not seen here since either
			}
		}
		edges, err := s.st.EdgesPage(ctx, f)
		if err != nil {
			return err
		}
		if len(edges) > limit {
			edges = edges[:limit]
			next := url.Values{"after": {edges[limit-1].Name}}
			if p.SilentOnly {
				next.Set("silent", "1")
			}
			if q.Get("limit") != "" {
				next.Set("limit", strconv.Itoa(limit))
			}
			p.Next = FleetPath + "?" + next.Encode()
		}
		for _, e := range edges {
			fe := s.fleetEdge(e, nil, now)
			if p.SilentOnly && !fe.Silent {
				continue // seen by this replica since the store's time
			}
			p.ShowRegion = p.ShowRegion || fe.Region != ""
			p.Edges = append(p.Edges, fe)
		}
		moves, err := s.st.FailingMoves(ctx, fleetRecent)
		if err != nil {
			return err
		}
		for _, m := range moves {
			p.FailingMoves = append(p.FailingMoves, *moveView(m))
		}
		if p.Egress, p.EgressTotal, err = s.egressHolders(ctx); err != nil {
			return err
		}
		p.Refusals, err = s.st.RecentAcks(ctx, manifest.AckRefused, fleetRecent)
		return err
	}()
	if err != nil {
		s.pageError(w, r, err)
		return
	}
	s.renderPage(w, r, http.StatusOK, "fleet", p)
}

type edgePage struct {
	Now         time.Time
	SilentAfter time.Duration
	Edge        fleetEdge
	// Assigned lists every slot with its assigned pool, reported or not.
	Assigned []assignedCell
}

type assignedCell struct {
	Name, Pool string
	Cell       *adminapi.CellView
}

func (s *Server) edgePage(w http.ResponseWriter, r *http.Request) {
	now := s.o.Now()
	e, v, err := s.edgeDetail(r.Context(), r.PathValue("id"))
	if err != nil {
		s.pageError(w, r, err)
		return
	}
	fe := s.fleetEdge(e, v.Assignments, now)
	fe.EdgeView = v
	p := edgePage{Now: now, SilentAfter: SilentAfter, Edge: fe}
	reported := map[string]*adminapi.CellView{}
	for i := range v.Cells {
		reported[v.Cells[i].Name] = &v.Cells[i]
	}
	for i := 1; i <= v.Slots; i++ {
		name := cellName(i)
		p.Assigned = append(p.Assigned, assignedCell{Name: name, Pool: v.Assignments[name], Cell: reported[name]})
	}
	s.renderPage(w, r, http.StatusOK, "edge", p)
}

func cellName(i int) string {
	if i < 10 {
		return "cell-0" + strconv.Itoa(i)
	}
	return "cell-" + strconv.Itoa(i)
}

// pageError answers a failed page: not found, or an internal error logged
// once.
func (s *Server) pageError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		http.Error(w, "not found", http.StatusNotFound)
	case r.Context().Err() != nil:
	default:
		s.log.Error("fleet page failed", zap.String("path", r.URL.Path), zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)
	}
}

// renderPage renders a whole page into memory first, so that a template
// error is a clean 500 rather than half a page.
func (s *Server) renderPage(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	var buf bytes.Buffer
	if err := fleetTemplates.ExecuteTemplate(&buf, name, data); err != nil {
		s.pageError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}
