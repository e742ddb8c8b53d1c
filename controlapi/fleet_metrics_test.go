package controlapi_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/fleet"
	"cellvisor/edgeapi"
	"cellvisor/egress"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// scrapeControl GETs the admin listener's /metrics with the admin token
// and returns the body and its parsed families.
func scrapeControl(t *testing.T, e *env) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	return testutil.Scrape(t, e.admin.URL+"/metrics", e.admin.Token)
}

// series lists name's series as "label=value,…" → value.
func series(fams map[string]*dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	f := fams[name]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		sort.Strings(ls)
		out[strings.Join(ls, ",")] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	return out
}

// reportSlots posts a status report of slots as x's agent would.
func (x egressEdge) reportSlots(t *testing.T, at time.Time, slots string) {
	t.Helper()
	status := json.RawMessage(`{"version":"test","control":{"active_sequence":0},"slots":` + slots + `}`)
	code, _, msg := post(t, x.hc, x.e.edgeURL+edgeapi.PathStatus, edgeapi.StatusReport{At: at, Status: status})
	if code != http.StatusNoContent {
		t.Fatalf("status: %d %s", code, msg)
	}
}

// checkPromtool runs promtool check metrics on a scrape.
func checkPromtool(t *testing.T, body string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool check metrics skipped: promtool not found (make deps installs Debian's prometheus package)")
		return
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// The pool and lease series and the fleet page follow the store: each
// edge's ready cells per pool from its report (drained and degraded cells
// are not ready; a pool name no pool has is not a label), every pool's
// minimum and domains, the lease holder with its epoch and expiry until
// the lease expires; promtool accepts the scrape.
func TestFleetSeriesAndHolders(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		clk := newClock()
		e = serveOn(t, e.dsn, e.sealKey, egressOpts(clk))
		eu1 := e.egressEdge(t, "eu-1", "acme", "eu")
		if _, err := e.admin.CreatePool(ctx(t), "reserved-m"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.admin.AssignCell(ctx(t), eu1.id, "cell-03", "reserved-m"); err != nil {
			t.Fatal(err)
		}
		eu1.reportSlots(t, clk.Now(), `[{"name":"cell-01","pool":"shared-default","state":"ready"},
			{"name":"cell-02","pool":"quarantine-default","state":"ready","drained":true},
			{"name":"cell-03","pool":"reserved-m","state":"degraded"},
			{"name":"cell-04","pool":"no-such-pool","state":"ready"},
			{"name":"cell-05","state":"stopped"}]`)
		publish(t, e, "app.test", "v1")
		if _, err := e.admin.SetEgressPolicy(ctx(t), "acme", "metering", adminapi.EgressPolicyRequest{Destination: egressDest, Region: "eu"}); err != nil {
			t.Fatal(err)
		}
		r := eu1.elect(t, egress.Metering, true)
		if r.Holder == nil || r.Holder.EdgeID != eu1.id {
			t.Fatalf("elect: %+v", r)
		}

		body, fams := scrapeControl(t, e)
		checkPromtool(t, body)
		id := eu1.id
		wantSeries := map[string]map[string]float64{
			"cellvisor_control_pool_ready_cells": {
				"edge=" + id + ",pool=shared-default": 1, "edge=" + id + ",pool=quarantine-default": 0, "edge=" + id + ",pool=reserved-m": 0},
			"cellvisor_control_egress_lease_holder": {"class=metering,edge=" + id + ",org=acme": 1},
			"cellvisor_control_egress_lease_epoch":  {"class=metering,org=acme": float64(r.Holder.Epoch)},
			"cellvisor_control_egress_lease_expiry_timestamp_seconds": {
				"class=metering,org=acme": float64(r.Holder.ExpiresAt.UnixMilli()) / 1000},
		}
		for name, want := range wantSeries {
			if got := series(fams, name); !maps.Equal(got, want) {
				t.Errorf("%s: %v, want %v", name, got, want)
			}
		}
		minReady, domains := series(fams, "cellvisor_control_pool_min_ready_cells"), series(fams, "cellvisor_control_pool_domains")
		if minReady["pool=reserved-m"] != 1 || minReady["pool=shared-default"] != 0 || domains["pool=shared-default"] != 1 || domains["pool=reserved-m"] != 0 {
			t.Errorf("min ready %v, domains %v: want reserved-m 1 and shared-default 0; shared-default 1 domain, reserved-m none", minReady, domains)
		}

		bearer := func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+e.admin.Token) }
		_, page := fleetGet(t, e, fleet.Path, bearer)
		holder := regexp.MustCompile(`<tr class="holder" data-scope="acme/metering"><td>acme</td><td>metering</td><td><a href="/fleet/edges/` +
			regexp.QuoteMeta(id) + `">eu-1</a></td><td>eu / eu-a</td><td>1</td><td>[^<]+</td></tr>`)
		if !holder.MatchString(page) {
			t.Errorf("the fleet page does not show eu-1 holding acme/metering at epoch 1:\n%s", page)
		}
		if !strings.Contains(page, "<th>Region</th>") || !strings.Contains(page, "<td>eu / eu-a</td>\n<td>enrolled</td>") {
			t.Errorf("the fleet page does not show the edge's region and zone:\n%s", page)
		}

		// A scrape with no report written since decodes none and says the
		// same; a new report (cell-03 ready, cell-01 drained) moves them.
		_, fams = scrapeControl(t, e)
		if got := series(fams, "cellvisor_control_pool_ready_cells"); !maps.Equal(got, wantSeries["cellvisor_control_pool_ready_cells"]) {
			t.Errorf("ready cells on a second scrape: %v", got)
		}
		eu1.reportSlots(t, clk.Now().Add(time.Second), `[{"name":"cell-01","pool":"shared-default","state":"ready","drained":true},
			{"name":"cell-03","pool":"reserved-m","state":"ready"}]`)
		_, fams = scrapeControl(t, e)
		if got, want := series(fams, "cellvisor_control_pool_ready_cells"), map[string]float64{
			"edge=" + id + ",pool=shared-default": 0, "edge=" + id + ",pool=quarantine-default": 0, "edge=" + id + ",pool=reserved-m": 1}; !maps.Equal(got, want) {
			t.Errorf("ready cells after a new report: %v, want %v", got, want)
		}

		// Past its expiry, unrenewed, the lease is nobody's.
		clk.add(3 * time.Second)
		_, fams = scrapeControl(t, e)
		for _, name := range []string{"cellvisor_control_egress_lease_holder", "cellvisor_control_egress_lease_epoch"} {
			if got := series(fams, name); len(got) != 0 {
				t.Errorf("%s after the lease expired: %v, want none", name, got)
			}
		}
		_, page = fleetGet(t, e, fleet.Path, bearer)
		if strings.Contains(page, `class="holder"`) {
			t.Errorf("the fleet page shows an expired lease's holder:\n%s", page)
		}
	})
}

// Every control API series docs/observability.md documents is in a real
// scrape of a control API that enrolled, polled, acked, reported, published
// and elected, and every cellvisor_control_* series of the scrape is
// documented: the docs cannot drift from the code.
func TestDocsListEveryControlMetric(t *testing.T) {
	b, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	at := strings.Index(doc, "## Control API metrics")
	if at < 0 {
		t.Fatal("docs/observability.md lacks its Control API metrics heading")
	}
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(cellvisor_control_[a-z_]+)` \\|").FindAllStringSubmatch(doc[at:], -1) {
		documented = append(documented, m[1])
	}

	clk := newClock()
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	e = serveOn(t, e.dsn, e.sealKey, egressOpts(clk))
	eu1 := e.egressEdge(t, "eu-1", "acme", "eu")
	eu1.reportSlots(t, clk.Now(), `[{"name":"cell-01","pool":"shared-default","state":"ready"}]`)
	if _, err := e.admin.SetEgressPolicy(ctx(t), "acme", "metering", adminapi.EgressPolicyRequest{Destination: egressDest}); err != nil {
		t.Fatal(err)
	}
	eu1.elect(t, egress.Metering, true)
	c, _, _ := e.enroll(t, e.createEdge(t, "live").Token)
	publish(t, e, "app.test", "v1") // built at the live edge's poll
	if _, err := c.Page(ctx(t), 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.Ack(ctx(t), manifest.Ack{Sequence: 1, Status: manifest.AckApplied, At: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	body, fams := scrapeControl(t, e)
	checkPromtool(t, body)
	var scraped []string
	for name := range fams {
		if strings.HasPrefix(name, "cellvisor_control_") {
			scraped = append(scraped, name)
		}
	}
	for _, name := range documented {
		if !slices.Contains(scraped, name) {
			t.Errorf("docs/observability.md documents %s, which the scrape lacks", name)
		}
	}
	for _, name := range scraped {
		if !slices.Contains(documented, name) {
			t.Errorf("the control API exports %s, which docs/observability.md does not document", name)
		}
	}
	if !slices.Contains(documented, "cellvisor_control_polls_total") {
		t.Errorf("no cellvisor_control_polls_total among the %d documented: the table's format changed?", len(documented))
	}
}
