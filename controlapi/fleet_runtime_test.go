package controlapi_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi/fleet"
	"cellvisor/edgeapi"
	"cellvisor/manifest"
)

// runtimeReport is an agent's status with two running cells on the given
// runtime versions, the first superseded or not.
func runtimeReport(current, first string, superseded bool, second string) json.RawMessage {
	sup := 0
	if superseded {
		sup = 1
	}
	cell := func(name, v string, s bool) map[string]any {
		return map[string]any{"name": name, "pool": "shared-default", "state": "ready", "sequence": 1,
			"runtime": map[string]any{"version": v, "superseded": s, "current": current}}
	}
	b, _ := json.Marshal(map[string]any{"version": "t",
		"runtime": map[string]any{"binary": "/usr/sbin/nginx", "version": current, "superseded": sup, "upgrade": "waiting", "reason": "runtime_upgrade is manual"},
		"slots":   []any{cell("cell-01", first, superseded), cell("cell-02", second, false)}})
	return b
}

// The fleet page says which runtime versions the cells run, on how many
// edges, and which edges still have cells on a superseded runtime (and
// their roll's state); each edge's row and page mark those cells. A
// report that says the cells were rolled takes the edge off the list.
func TestFleetPageShowsRuntimes(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		bearer := func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+e.admin.Token) }
		old, fresh := e.createEdge(t, "old-runtime"), e.createEdge(t, "new-runtime")
		oc, _, _ := e.enroll(t, old.Token)
		fc, _, _ := e.enroll(t, fresh.Token)
		at := time.Now()
		if err := oc.Report(ctx(t), edgeapi.StatusReport{At: at, Status: runtimeReport("nginx/1.22.2", "nginx/1.22.1", true, "nginx/1.22.2")}); err != nil {
			t.Fatal(err)
		}
		if err := fc.Report(ctx(t), edgeapi.StatusReport{At: at, Status: runtimeReport("nginx/1.22.2", "nginx/1.22.2", false, "nginx/1.22.2")}); err != nil {
			t.Fatal(err)
		}

		resp, body := fleetGet(t, e, fleet.Path, bearer)
		if resp.StatusCode != http.StatusOK {
			t.Fatal(resp.Status)
		}
		for _, want := range []string{
			`<tr class="runtime-version" data-version="nginx/1.22.1"><td>nginx/1.22.1</td><td>1</td><td>1</td></tr>`,
			`<tr class="runtime-version" data-version="nginx/1.22.2"><td>nginx/1.22.2</td><td>2</td><td>3</td></tr>`,
			`<tr class="superseded" data-edge-id="` + old.Edge.ID + `"><td><a href="/fleet/edges/` + old.Edge.ID + `">old-runtime</a></td><td>1</td><td>nginx/1.22.2</td><td>waiting</td>`,
			`data-superseded="1">1 cell(s) on a superseded runtime</span>`,
			`old runtime nginx/1.22.1</span>`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("the fleet page lacks %s:\n%s", want, body)
			}
		}
		if strings.Contains(body, `data-edge-id="`+fresh.Edge.ID+`"`) {
			t.Error("an edge with every cell on the current runtime is listed as superseded")
		}

		_, body = fleetGet(t, e, fleet.Edges+"/"+old.Edge.ID, bearer)
		if !strings.Contains(body, `<td class="runtime">nginx/1.22.1 <span class="marker superseded">superseded</span></td>`) ||
			!strings.Contains(body, "runtime_upgrade is manual") {
			t.Errorf("the edge page does not mark cell-01's superseded runtime or say why it waits:\n%s", body)
		}

		// Rolled: the next report takes it off the list.
		if err := oc.Report(ctx(t), edgeapi.StatusReport{At: at.Add(time.Second), Status: runtimeReport("nginx/1.22.2", "nginx/1.22.2", false, "nginx/1.22.2")}); err != nil {
			t.Fatal(err)
		}
		_, body = fleetGet(t, e, fleet.Path, bearer)
		if strings.Contains(body, `data-version="nginx/1.22.1"`) || strings.Contains(body, `<tr class="superseded"`) ||
			!strings.Contains(body, `<td>nginx/1.22.2</td><td>2</td><td>4</td>`) {
			t.Errorf("after the roll the page still shows the old runtime:\n%s", body)
		}
	})
}

// An ack carries the runtime each running cell ran: kept with the ack,
// shown in the edge's view and on its fleet page. Runtimes that break a
// rule are refused (400, naming it), and the agent's client sends that ack
// again without them, so what was applied is recorded.
func TestAckRuntimes(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		created := e.createEdge(t, "acking")
		c, _, dir := e.enroll(t, created.Token)
		publish(t, e, "app.test", "v1")
		if _, err := c.Page(ctx(t), 0, ""); err != nil {
			t.Fatal(err)
		}
		rts := []manifest.CellRuntime{{Cell: "cell-01", Version: "nginx/1.22.1", Superseded: true}, {Cell: "cell-02", Version: "nginx/1.22.2"}}
		if err := c.Ack(ctx(t), manifest.Ack{Sequence: 1, Status: manifest.AckApplied, At: time.Now(), Runtimes: rts}); err != nil {
			t.Fatal(err)
		}
		v, err := e.admin.Edge(ctx(t), created.Edge.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Acks) != 1 || !slices.Equal(v.Acks[0].Runtimes, rts) {
			t.Fatalf("acks %+v, want the one with runtimes %+v", v.Acks, rts)
		}
		bearer := func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+e.admin.Token) }
		_, body := fleetGet(t, e, fleet.Edges+"/"+created.Edge.ID, bearer)
		if !strings.Contains(body, `<span class="cell-runtime" data-cell="cell-01">cell-01 nginx/1.22.1 <span class="superseded">superseded</span></span> <span class="cell-runtime" data-cell="cell-02">cell-02 nginx/1.22.2</span>`) {
			t.Errorf("the edge page's acks do not show the runtimes:\n%s", body)
		}

		for _, tc := range []struct {
			name string
			rts  []manifest.CellRuntime
			want string
		}{
			{"not a cell", []manifest.CellRuntime{{Cell: "cell-33", Version: "nginx/1.22.1"}}, "want cell-01 to cell-32"},
			{"markup as version", []manifest.CellRuntime{{Cell: "cell-01", Version: "<script>"}}, "want at most 64 characters"},
		} {
			code, _, msg := post(t, e.rawEdgeClient(t, dir), e.edgeURL+edgeapi.PathAcks, manifest.Ack{Sequence: 1, Status: manifest.AckApplied, At: time.Now(), Runtimes: tc.rts})
			if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
				t.Errorf("%s: %d %q, want 400 naming %q", tc.name, code, msg, tc.want)
			}
		}
		// The client's fallback: the ack is taken without them.
		if err := c.Ack(ctx(t), manifest.Ack{Sequence: 1, Status: manifest.AckPartial, Reason: "one cell slow", At: time.Now(),
			Runtimes: []manifest.CellRuntime{{Cell: "cell-99"}}}); err != nil {
			t.Fatalf("an ack with refused runtimes: %v, want it delivered without them", err)
		}
		v, _ = e.admin.Edge(ctx(t), created.Edge.ID)
		if len(v.Acks) != 1 || v.Acks[0].Status != manifest.AckPartial || len(v.Acks[0].Runtimes) != 0 {
			t.Fatalf("acks %+v, want the partial one without runtimes", v.Acks)
		}
	})
}
