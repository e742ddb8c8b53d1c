// Package fleet serves the fleet page: server-rendered HTML on the admin
// listener, for operators: every edge with its cells, the failing moves,
// the egress holders and the recent refusals, and a page per edge, behind
// a sign-in of its own. No JavaScript and no external assets; everything
// shown is escaped by html/template (edge names, cell names and reasons
// come from agents and are treated as hostile). See docs/control.md. It
// reads through Reader, which controlapi implements over its store and its
// poll cache; only controlapi imports it.
package fleet

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
	"cellvisor/manifest"
)

// Fleet page paths, on the admin listener.
const (
	Path   = adminapi.PathFleet
	Login  = Path + "/login"
	Logout = Path + "/logout"
	Edges  = Path + "/edges"
	Style  = Path + "/style.css"
)

const (
	// SilentAfter is how long an enrolled edge may go unseen (no poll, no
	// status report) before the fleet page marks it silent. An agent
	// reports its status every 15 s by default and backs off to at most
	// 2 minutes while the control API is unreachable.
	SilentAfter = 2 * time.Minute
	// PageSize is the number of edges on a fleet page, unless ?limit asks
	// for another (up to PageMax).
	PageSize = 200
	PageMax  = 1000
	// recent bounds the refusals, failing moves, acks and tasks shown.
	recent = 20
)

// ErrNotFound is what Reader.Edge's error Is for an edge that does not
// exist: the page answers 404.
var ErrNotFound = errors.New("not found")

// Reader is what the pages read: the store's view of the fleet, with
// this replica's own sightings of the edges laid over it.
type Reader interface {
	// CountEdges counts every edge.
	CountEdges(ctx context.Context) (int, error)
	// CountSilent counts the enrolled edges seen neither in the store nor
	// by this replica since before.
	CountSilent(ctx context.Context, before time.Time) (int, error)
	// Edges lists the edges by name after q.After, at most q.Limit; with
	// q.SilentBefore set, those the store has not seen since.
	Edges(ctx context.Context, q Query) ([]adminapi.EdgeView, error)
	// Edge is one edge as edge show shows it (its error Is ErrNotFound
	// for an unknown id).
	Edge(ctx context.Context, id string) (adminapi.EdgeView, error)
	// FailingMoves lists the newest failed or overdue moves, at most limit.
	FailingMoves(ctx context.Context, limit int) ([]adminapi.MoveView, error)
	// EgressHolders lists the egress lease holders at now, at most limit,
	// and how many there are.
	EgressHolders(ctx context.Context, now time.Time, limit int) ([]EgressHolder, int, error)
	// Refusals lists the newest refused acknowledgements of every edge, at
	// most limit.
	Refusals(ctx context.Context, limit int) ([]Refusal, error)
	// Runtimes sums up the cells' runtimes the enrolled edges last
	// reported, with at most limit of the edges whose cells run a
	// superseded one.
	Runtimes(ctx context.Context, limit int) (Runtimes, error)
}

// Runtimes is what the fleet's cells run, as their edges last reported.
type Runtimes struct {
	// Versions are the runtime versions cells run, newest name last
	// ("unknown" for a cell whose agent could not tell).
	Versions []RuntimeVersion
	// Superseded are edges with cells on a superseded runtime (a
	// package replaced its binary or a module, the cells not rolled onto
	// it yet), at most the limit asked for, by name; SupersededTotal
	// counts them all.
	Superseded      []SupersededEdge
	SupersededTotal int
}

// RuntimeVersion is one runtime version: the edges with a cell on it and
// those cells.
type RuntimeVersion struct {
	Version      string
	Edges, Cells int
}

// SupersededEdge is an edge whose cells run a superseded runtime: how many,
// what its binary is now, and its roll's state and reason.
type SupersededEdge struct {
	EdgeID, EdgeName string
	Cells            int
	Current          string
	Upgrade, Reason  string
}

// Query selects a page of edges.
type Query struct {
	After        string
	Limit        int
	SilentBefore time.Time
}

// EgressHolder is the edge holding the egress lease of one (org, traffic
// class), at its fencing epoch, until its expiry unless renewed. Region
// is its region and zone as shown (RegionZone).
type EgressHolder struct {
	Org, Class, EdgeID, EdgeName, Region string
	Epoch                                int64
	Until                                time.Time
}

// Refusal is an edge's refused acknowledgement.
type Refusal struct {
	EdgeID, EdgeName string
	manifest.Ack
	ReceivedAt time.Time
}

// Options configure the pages.
type Options struct {
	// Reader is what the pages show. Required.
	Reader Reader
	// AdminToken signs in (in the form, or as a bearer token) and keys
	// the session cookies. Required.
	AdminToken string
	// Logger, or nil for none.
	Logger *zap.Logger
	// Now is the clock, or nil for time.Now.
	Now func() time.Time
}

// Pages serve the fleet page, its edge pages and its sign-in.
type Pages struct {
	o   Options
	log *zap.Logger
}

// New checks o and fills its defaults.
func New(o Options) (*Pages, error) {
	switch {
	case o.Reader == nil:
		return nil, errors.New("fleet: no reader")
	case o.AdminToken == "":
		return nil, errors.New("fleet: no admin token")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Pages{o: o, log: o.Logger}, nil
}

//go:embed templates
var files embed.FS

var templates = template.Must(template.New("fleet").Funcs(template.FuncMap{
	"ts":         func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"clip":       clip,
	"stateClass": stateClass,
}).ParseFS(files, "templates/*.html"))

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
	case state == "ready", state == "degraded", state == "drained", state == "stopped", state == "waiting":
		return "state-" + state
	}
	return "state-other"
}

// Handler serves the fleet page, its sign-in and its style sheet. It
// authenticates by itself (a session cookie or the bearer token): the
// admin API's bearer check is not in front of it.
func (p *Pages) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Style, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, files, "templates/style.css")
	})
	mux.HandleFunc("GET "+Login, p.loginForm)
	mux.HandleFunc("POST "+Login, p.login)
	mux.HandleFunc("POST "+Logout, p.logout)
	mux.HandleFunc("GET "+Path, p.requireSession(p.fleetPage))
	mux.HandleFunc("GET "+Edges+"/{id}", p.requireSession(p.edgePage))
	// Cross-origin POSTs (a sign-in or sign-out forged by another site)
	// are refused from the browser's Sec-Fetch-Site and Origin headers;
	// the session cookie is SameSite=Strict besides.
	return http.NewCrossOriginProtection().Handler(mux)
}

// Handles reports a path the fleet handler serves.
func Handles(path string) bool {
	return path == Path || len(path) > len(Path) && path[:len(Path)+1] == Path+"/"
}

type loginPage struct{ Error string }

// RegionZone is an edge's region and zone as the pages show them.
func RegionZone(region, zone string) string {
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
	// Region is its region and zone: the page shows the column only when
	// some edge has one.
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

func newFleetEdge(v adminapi.EdgeView, now time.Time) fleetEdge {
	f := fleetEdge{EdgeView: v, Region: RegionZone(v.Region, v.Zone)}
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
	Refusals     []Refusal
	Runtimes     Runtimes
}

func (p *Pages) fleetPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := PageSize
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > PageMax {
			http.Error(w, "limit: want 1–"+strconv.Itoa(PageMax), http.StatusBadRequest)
			return
		}
		limit = n
	}
	now := p.o.Now()
	fp := fleetPage{Now: now, SilentAfter: SilentAfter, SilentOnly: q.Get("silent") == "1", Paged: q.Get("after") != ""}
	eq := Query{After: q.Get("after"), Limit: limit + 1}
	if fp.SilentOnly {
		eq.SilentBefore = now.Add(-SilentAfter)
	}
	err := func() error {
		ctx := r.Context()
		var err error
		if fp.Total, err = p.o.Reader.CountEdges(ctx); err != nil {
			return err
		}
		if fp.Silent, err = p.o.Reader.CountSilent(ctx, now.Add(-SilentAfter)); err != nil {
			return err
		}
		edges, err := p.o.Reader.Edges(ctx, eq)
		if err != nil {
			return err
		}
		if len(edges) > limit {
			edges = edges[:limit]
			next := url.Values{"after": {edges[limit-1].Name}}
			if fp.SilentOnly {
				next.Set("silent", "1")
			}
			if q.Get("limit") != "" {
				next.Set("limit", strconv.Itoa(limit))
			}
			fp.Next = Path + "?" + next.Encode()
		}
		for _, e := range edges {
			fe := newFleetEdge(e, now)
			if fp.SilentOnly && !fe.Silent {
				continue // seen by this replica since the store's time
			}
			fp.ShowRegion = fp.ShowRegion || fe.Region != ""
			fp.Edges = append(fp.Edges, fe)
		}
		if fp.FailingMoves, err = p.o.Reader.FailingMoves(ctx, recent); err != nil {
			return err
		}
		if fp.Egress, fp.EgressTotal, err = p.o.Reader.EgressHolders(ctx, now, PageMax); err != nil {
			return err
		}
		if fp.Refusals, err = p.o.Reader.Refusals(ctx, recent); err != nil {
			return err
		}
		fp.Runtimes, err = p.o.Reader.Runtimes(ctx, recent)
		return err
	}()
	if err != nil {
		p.pageError(w, r, err)
		return
	}
	p.render(w, r, http.StatusOK, "fleet", fp)
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

func (p *Pages) edgePage(w http.ResponseWriter, r *http.Request) {
	now := p.o.Now()
	v, err := p.o.Reader.Edge(r.Context(), r.PathValue("id"))
	if err != nil {
		p.pageError(w, r, err)
		return
	}
	ep := edgePage{Now: now, SilentAfter: SilentAfter, Edge: newFleetEdge(v, now)}
	reported := map[string]*adminapi.CellView{}
	for i := range v.Cells {
		reported[v.Cells[i].Name] = &v.Cells[i]
	}
	for i := 1; i <= v.Slots; i++ {
		name := cellName(i)
		ep.Assigned = append(ep.Assigned, assignedCell{Name: name, Pool: v.Assignments[name], Cell: reported[name]})
	}
	p.render(w, r, http.StatusOK, "edge", ep)
}

func cellName(i int) string {
	if i < 10 {
		return "cell-0" + strconv.Itoa(i)
	}
	return "cell-" + strconv.Itoa(i)
}

// pageError answers a failed page: not found, or an internal error logged
// once.
func (p *Pages) pageError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		http.Error(w, "not found", http.StatusNotFound)
	case r.Context().Err() != nil:
	default:
		p.log.Error("fleet page failed", zap.String("path", r.URL.Path), zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)
	}
}

// render renders a whole page into memory first, so that a template error
// is a clean 500 rather than half a page.
func (p *Pages) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	var buf bytes.Buffer
	if err := templates.ExecuteTemplate(&buf, name, data); err != nil {
		p.pageError(w, r, err)
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
