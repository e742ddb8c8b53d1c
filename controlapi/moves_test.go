package controlapi_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/manifest"
)

// await polls the admin API until ok says the domain's move is where the
// test wants it, bounded by the test's context.
func await(t *testing.T, e *env, domain string, ok func(adminapi.DomainView) bool) adminapi.DomainView {
	t.Helper()
	return poll(t, func(c context.Context) (adminapi.DomainView, error) { return e.admin.Domain(c, domain) }, ok,
		func(d adminapi.DomainView) string {
			return fmt.Sprintf("domain %s never got there: %+v, move %+v", domain, d, d.Move)
		})
}

// poll calls get every 20 ms until ok holds of what it returns, bounded by
// the test's context; failed says what was seen last when it never does.
func poll[T any](t *testing.T, get func(context.Context) (T, error), ok func(T) bool, failed func(T) string) T {
	t.Helper()
	c := ctx(t)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		v, err := get(c)
		if err != nil {
			t.Fatal(err)
		}
		if ok(v) {
			return v
		}
		select {
		case <-c.Done():
			t.Fatal(failed(v))
		case <-tick.C:
		}
	}
}

func moveState(state string) func(adminapi.DomainView) bool {
	return func(d adminapi.DomainView) bool { return d.Move != nil && d.Move.State == state }
}

// collect reads the edge's newest manifest and checks its header, the
// signed assignments included.
func collect(t *testing.T, c *controlclient.Client, id controlclient.Identity) manifest.Manifest {
	t.Helper()
	m, err := manifest.Collect(ctx(t), c.Page, id.EdgeID, 0)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := base64.StdEncoding.DecodeString(id.ControlPublicKey)
	if _, err := m.VerifyHeader(ed25519.PublicKey(pub), id.EdgeID); err != nil || m.Assignments == nil {
		t.Fatalf("manifest %d: header %v, assignments %+v", m.Sequence, err, m.Assignments)
	}
	return m
}

// applyAndReport acknowledges the edge's current sequence and reports the
// cells ready at it (not ready: a name ending in "!"), each on port
// 8000+its number.
func applyAndReport(t *testing.T, c *controlclient.Client, seq int64, cells ...string) {
	t.Helper()
	if err := c.Ack(ctx(t), manifest.Ack{Sequence: seq, Status: manifest.AckApplied, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var slots []map[string]any
	for _, cell := range cells {
		state := "ready"
		if name, ok := strings.CutSuffix(cell, "!"); ok {
			cell, state = name, "starting"
		}
		var n int
		fmt.Sscanf(cell, "cell-%d", &n)
		pool := "reserved-eu"
		if cell == "cell-01" {
			pool = "shared-default"
		}
		slots = append(slots, map[string]any{"name": cell, "pool": pool, "state": state, "sequence": seq, "http_port": 8000 + n})
	}
	status, _ := json.Marshal(map[string]any{"version": "t", "slots": slots})
	if err := c.Report(ctx(t), edgeapi.StatusReport{At: time.Now(), Status: status}); err != nil {
		t.Fatal(err)
	}
}

// routes is the routing view of a domain as cell@host:port.
func routes(t *testing.T, e *env, domain string) []string {
	t.Helper()
	return routeList(t, e, domain, func(r adminapi.Route) string { return r.Cell + "@" + r.HostPort() })
}

// routeList is the routing view of a domain, each route as f writes it.
func routeList(t *testing.T, e *env, domain string, f func(adminapi.Route) string) []string {
	t.Helper()
	v, err := e.admin.Routing(ctx(t), domain)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range v.Routes {
		out = append(out, f(r))
	}
	return out
}

func TestMoveThroughTheAPIs(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e = serveOn(t, e.dsn, e.sealKey, func(o *controlapi.Options) { o.MoveTick = 50 * time.Millisecond; o.MoveReadyWithin = time.Minute })
		a := e.createEdge(t, "a")
		c, id, _ := e.enroll(t, a.Token)
		publish(t, e, "shop.example.test", "v1")
		drain := "300ms"
		if _, err := e.admin.UpdatePool(ctx(t), "shared-default", adminapi.PoolRequest{Drain: &drain}); err != nil {
			t.Fatal(err)
		}
		two := 2
		if _, err := e.admin.CreatePoolWith(ctx(t), adminapi.PoolRequest{Name: "reserved-eu", Replicas: &two}); err != nil {
			t.Fatal(err)
		}
		for _, cell := range []string{"cell-03", "cell-04"} {
			if _, err := e.admin.AssignCell(ctx(t), "a", cell, "reserved-eu"); err != nil {
				t.Fatal(err)
			}
		}
		m := collect(t, c, id)
		if m.Assignments.Cells["cell-03"] != "reserved-eu" || m.Assignments.Pools["reserved-eu"].Class != "reserved" {
			t.Fatalf("signed assignments %+v", m.Assignments)
		}
		applyAndReport(t, c, m.Sequence, "cell-01", "cell-03", "cell-04")
		if got := routes(t, e, "shop.example.test"); !slices.Equal(got, []string{"cell-01@192.0.2.10:8001"}) {
			t.Fatalf("routing before the move: %v", got)
		}

		if _, err := e.admin.Move(ctx(t), "shop.example.test", "reserved-eu"); err != nil {
			t.Fatal(err)
		}
		m = collect(t, c, id)
		if len(m.Entries) != 1 || !slices.Equal(m.Entries[0].Cells, []string{"cell-01", "cell-03", "cell-04"}) || m.Entries[0].Pool != "shared-default" {
			t.Fatalf("entry during the move: %+v", m.Entries)
		}
		// Applied, but cell-04 not ready: routing stays on the source.
		applyAndReport(t, c, m.Sequence, "cell-01", "cell-03", "cell-04!")
		d := await(t, e, "shop.example.test", func(d adminapi.DomainView) bool { return strings.Contains(d.Move.WaitingFor, "cell-04") })
		if d.Move.State != "waiting" || !strings.Contains(d.Move.WaitingFor, "starting") {
			t.Fatalf("switched with a target not ready: %+v", d.Move)
		}
		if got := routes(t, e, "shop.example.test"); !slices.Equal(got, []string{"cell-01@192.0.2.10:8001"}) {
			t.Fatalf("routing while a target is not ready: %v", got)
		}
		applyAndReport(t, c, m.Sequence, "cell-01", "cell-03", "cell-04")
		await(t, e, "shop.example.test", func(d adminapi.DomainView) bool { return d.Move.State != "waiting" })
		if got := routes(t, e, "shop.example.test"); !slices.Equal(got, []string{"cell-03@192.0.2.10:8003", "cell-04@192.0.2.10:8004"}) {
			t.Fatalf("routing after the switch: %v", got)
		}
		// One replica reported not ready (a crash backoff): the routing
		// view lists only the one that serves.
		applyAndReport(t, c, m.Sequence, "cell-01", "cell-03!", "cell-04")
		if got := routes(t, e, "shop.example.test"); !slices.Equal(got, []string{"cell-04@192.0.2.10:8004"}) {
			t.Fatalf("routing with cell-03 not ready: %v", got)
		}
		applyAndReport(t, c, m.Sequence, "cell-01", "cell-03", "cell-04")
		d = await(t, e, "shop.example.test", moveState("done"))
		m = collect(t, c, id)
		if len(m.Entries) != 1 || !slices.Equal(m.Entries[0].Cells, []string{"cell-03", "cell-04"}) || m.Entries[0].Pool != "reserved-eu" {
			t.Fatalf("entry after the move: %+v", m.Entries)
		}
		var switched, drained time.Time
		for _, st := range d.Move.Steps {
			switch st.Step {
			case "switched":
				switched = st.At
			case "drained":
				drained = st.At
			}
		}
		if switched.IsZero() || drained.Sub(switched) < 300*time.Millisecond {
			t.Errorf("drained at %s, switched at %s: the drain interval is 300ms", drained, switched)
		}
	})
}
