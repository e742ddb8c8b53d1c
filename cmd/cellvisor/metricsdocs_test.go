package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"cellvisor/agent"
	"cellvisor/controlapi/adminapi"
	"cellvisor/edgeapi"
	"cellvisor/internal/testcert"
	"cellvisor/testkit/testutil"
)

// documentedAgentMetrics are the series docs/observability.md lists under
// "## Agent metrics".
func documentedAgentMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start, end := strings.Index(doc, "## Agent metrics"), strings.Index(doc, "## Control API metrics")
	if start < 0 || end < start {
		t.Fatal("docs/observability.md lacks its Agent metrics or Control API metrics heading")
	}
	var out []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(cellvisor_[a-z_]+)` \\|").FindAllStringSubmatch(doc[start:end], -1) {
		out = append(out, m[1])
	}
	if !slices.Contains(out, "cellvisor_cell_ready") {
		t.Fatalf("no cellvisor_cell_ready among the %d documented agent series: the tables' format changed?", len(out))
	}
	return out
}

// A real agent, enrolled, with governed egress (holding its lease through
// a fake that speaks the election contract in front of the real control
// API), front doors and a running cell, exports every series the docs
// list and nothing they do not: the docs cannot drift from the agent.
// promtool accepts the scrape.
func TestEnrolledAgentMetricsMatchTheDocs(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	intake, metricsAddr := freeAddr(t), freeAddr(t)
	cfgPath, cfg := agentConfig(t, 1, fmt.Sprintf("metrics:\n  listen: %s\nsource:\n  poll_interval: 100ms\n  max_backoff: 400ms\n  status_interval: 200ms\n"+
		"egress:\n  intake_listen: %s\n  interval: 200ms\n  max_renew: 1s\n", metricsAddr, intake))
	c.enroll(t, bin, cfgPath, adminapi.EdgeRequest{Name: "metrics", Org: "acme", Country: "NL", Continent: "EU", Slots: 1})
	id, _, err := agent.LoadIdentity(cfg.Identity())
	if err != nil {
		t.Fatal(err)
	}
	frontEgress(t, c, cfg, id, intake)

	// With a certificate, for the cell's certificate series.
	cert := testcert.New(t, testcert.Options{Names: []string{"app.test"}})
	if _, err := c.admin.PutCertificate(ctxT(t), "app", adminapi.CertificateRequest{Chain: string(cert.PEM()), Key: string(cert.Key)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.admin.Publish(ctxT(t), "app.test", adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(
		`{"hostnames":["app.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"v1"}}],"tls":{"certificate":"app"}}`)}); err != nil {
		t.Fatal(err)
	}
	_, st := startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, st.Slots[0].HTTPPort, "v1")
	awaitEgressRoute(t, cfg, "metering", edgeapi.RouteDirect)

	documented := documentedAgentMetrics(t)
	var body string
	testutil.Eventually(t, 30*time.Second, func() error {
		var fams map[string]*dto.MetricFamily
		body, fams = scrape(t, metricsAddr)
		for _, err := range []error{
			want(t, fams, 1, "cellvisor_agent_enrollment_state", "state", "enrolled"),
			want(t, fams, 1, "cellvisor_egress_lease_holder", "class", "metering"),
			want(t, fams, 1, "cellvisor_egress_route", "class", "metering", "route", edgeapi.RouteDirect),
			want(t, fams, 0, "cellvisor_egress_error"),
			want(t, fams, 0, "cellvisor_frontdoor_fetch_failing"),
			want(t, fams, 1, "cellvisor_cell_report_ok", "cell", "cell-01", "pool", "shared-default"),
		} {
			if err != nil {
				return err
			}
		}
		var missing, undocumented []string
		for _, name := range documented {
			if _, ok := fams[name]; !ok {
				missing = append(missing, name)
			}
		}
		for name := range fams {
			if strings.HasPrefix(name, "cellvisor_") && !slices.Contains(documented, name) {
				undocumented = append(undocumented, name)
			}
		}
		if len(missing) > 0 || len(undocumented) > 0 {
			return fmt.Errorf("documented in docs/observability.md but not scraped: %v; scraped but not documented: %v", missing, undocumented)
		}
		return nil
	})
	checkMetricsWithPromtool(t, body)
}
