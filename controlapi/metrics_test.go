package controlapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/testkit/testutil"
)

// A status report equal to the last one written but for its timestamp and
// an idle agent's measurements is not written; a change is, at once. Read
// back from the metrics and from edge show.
func TestUnchangedStatusIsNotWritten(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	edge := e.createEdge(t, "a")
	c, _, _ := e.enroll(t, edge.Token)
	report := func(state, lastPoll string, mem int) {
		t.Helper()
		st := `{"version":"t","control":{"active_sequence":1,"last_poll":"` + lastPoll + `"},"slots":[{"name":"cell-01","pool":"shared-default",` +
			`"state":"` + state + `","usage":{"memory_bytes":` + strings.Repeat("1", mem) + `}}]}`
		if err := c.Report(ctx(t), edgeapi.StatusReport{At: time.Now().UTC(), Status: json.RawMessage(st)}); err != nil {
			t.Fatal(err)
		}
	}
	fams := func() (written, unchanged, puts float64) {
		t.Helper()
		f, err := e.srv.Metrics().Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		return counter(f, "cellvisor_control_status_reports_total", map[string]string{"result": "written"}),
			counter(f, "cellvisor_control_status_reports_total", map[string]string{"result": "unchanged"}),
			counter(f, "cellvisor_control_db_writes_total", map[string]string{"kind": "PutStatus"})
	}
	report("ready", "2026-01-01T00:00:00Z", 3)
	report("ready", "2026-01-01T00:00:10Z", 4) // only last_poll and usage moved
	if w, u, p := fams(); w != 1 || u != 1 || p != 1 {
		t.Fatalf("written %v, unchanged %v, PutStatus writes %v: want 1, 1, 1", w, u, p)
	}
	report("drained", "2026-01-01T00:00:20Z", 4) // a cell changed
	if w, u, p := fams(); w != 2 || u != 1 || p != 2 {
		t.Fatalf("written %v, unchanged %v, PutStatus writes %v: want 2, 1, 2", w, u, p)
	}
	v, err := e.admin.Edge(ctx(t), edge.Edge.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Cells) == 0 || v.Cells[0].State != "drained" {
		t.Fatalf("edge show cells %+v: want cell-01 drained", v.Cells)
	}
}

// /metrics answers the metrics token and the admin token, nothing else,
// and names routes by their pattern.
func TestMetricsEndpoint(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	edge := e.createEdge(t, "a")
	c, _, _ := e.enroll(t, edge.Token)
	// A request as the edge: it is seen.
	if err := c.Report(ctx(t), edgeapi.StatusReport{At: time.Now().UTC(), Status: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	get := func(token string) (int, string) { return testutil.Get(t, e.admin.URL+"/metrics", token) }
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("no token: HTTP %d, want 401", code)
	}
	if code, _ := get("wrong-token-0123456789"); code != http.StatusUnauthorized {
		t.Errorf("wrong token: HTTP %d, want 401", code)
	}
	code, body := get(e.admin.Token)
	if code != http.StatusOK {
		t.Fatalf("admin token: HTTP %d", code)
	}
	for _, want := range []string{
		`cellvisor_control_enrollments_total{outcome="enrolled"} 1`,
		`cellvisor_control_edges{state="enrolled"} 1`,
		`cellvisor_control_http_request_duration_seconds_count{code="200",listener="edge",route="POST /v1/enroll"} 1`,
		`cellvisor_control_edge_last_seen_timestamp_seconds{edge="` + edge.Edge.ID + `"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Every status report written is one database write, whatever parts it
// has: without an egress part, with one, with gateways (issue 32: two or
// three writes per report before, 500 writes/s at 10,000 edges).
func TestStatusReportIsOneWrite(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		edge := e.createEdge(t, "a")
		c, _, _ := e.enroll(t, edge.Token)
		writes := func() float64 {
			t.Helper()
			f, err := e.srv.Metrics().Registry().Gather()
			if err != nil {
				t.Fatal(err)
			}
			// Touch is the batched last-seen flush, on its own clock.
			return counter(f, "cellvisor_control_db_writes_total", nil) - counter(f, "cellvisor_control_db_writes_total", map[string]string{"kind": "Touch"})
		}
		gws := []edgeapi.Gateway{{Service: "https", Protocol: "https", Port: 8443, TLS: true, Healthy: true}}
		for i, tc := range []struct {
			name     string
			egress   string
			gateways []edgeapi.Gateway
		}{
			{name: "status only"},
			{name: "with an egress part", egress: `,"egress":{"intake_url":"https://127.0.0.1:7001/","reach":{"metering":{"destination":"https://d.example/m","reachable":true,"checked_at":"2026-01-01T00:00:00Z"}}}`},
			{name: "with gateways", gateways: gws},
			{name: "with both", egress: `,"egress":{"intake_url":"https://127.0.0.1:7002/"}`, gateways: gws},
		} {
			before := writes()
			st := fmt.Sprintf(`{"version":"t%d"%s}`, i, tc.egress)
			if err := c.Report(ctx(t), edgeapi.StatusReport{At: time.Now().UTC(), Status: json.RawMessage(st), Gateways: tc.gateways}); err != nil {
				t.Fatal(err)
			}
			if d := writes() - before; d != 1 {
				t.Errorf("%s: %v database writes, want 1", tc.name, d)
			}
		}
		fds, err := e.st.Gateways(ctx(t), edge.Edge.ID)
		if err != nil || len(fds) != 1 || fds[0].Port != 8443 {
			t.Fatalf("gateways after the reports: %+v, %v", fds, err)
		}
		if ee, err := e.st.EgressEdge(ctx(t), edge.Edge.ID); err != nil || ee.IntakeURL != "https://127.0.0.1:7002/" {
			t.Fatalf("egress edge after the reports: %+v, %v", ee, err)
		}
	})
}
