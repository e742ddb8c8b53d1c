package agentmetrics

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"cellvisor/activation"
	"cellvisor/cellapi"
	"cellvisor/cgroup"
	"cellvisor/supervisor"
)

var fetched = time.Unix(1500, 0)

func fakeStatus(context.Context) supervisor.Status {
	return supervisor.Status{
		Version: "v1.2.3", CgroupMode: cgroup.ModeV2, Enforced: true, StartedAt: time.Unix(1000, 0),
		Control: &supervisor.ControlStatus{Enrollment: "not enrolled", ActiveSequence: 7, PendingAcks: 2,
			FrontDoors: &supervisor.FrontDoorStatus{Rows: 3, LastFetch: &fetched, Error: "front doors refused: row 2: not canonical"}},
		Slots: []supervisor.SlotStatus{
			{Name: "cell-01", Pool: "shared-default", Assignment: supervisor.Assigned, State: supervisor.StateReady, PID: 42,
				Restarts: 3, OperatorRestarts: 1, Limits: cgroup.Limits{MemoryBytes: 512 << 20, CPUQuotaUS: 50000, CPUPeriodUS: 100000, PIDs: 128},
				Usage: &cgroup.Usage{MemoryBytes: 1 << 20, CPUUsageNS: 2_500_000_000, PIDs: 3},
				Cell: &cellapi.Status{Requests: 9, Connections: cellapi.Connections{Active: 4},
					Origins: map[string]cellapi.Origin{"a.test/o1": {Failures: 2, Reasons: map[string]int64{"reset": 2}},
						"b.test/o2": {Failures: 5, Reasons: map[string]int64{"http_5xx": 3, "reset": 1}}},
					OriginServers: map[string]cellapi.OriginServer{"a.test/o1 http://192.0.2.1": {Up: false, Retries: 2, Checks: 5, CheckFailures: 3},
						"a.test/o1 http://192.0.2.2": {Up: true, Retries: 1}},
					Security: cellapi.Security{AuthFailures: 6}, Bodies: cellapi.Bodies{Held: 1024, Refused: 8}},
				Disk: &supervisor.DiskUse{Cache: supervisor.DiskBudget{Bytes: 3 << 20, Budget: 256 << 20},
					RequestTmp: supervisor.DiskBudget{Bytes: 2 << 20, Unlinked: 2 << 20, Budget: 64 << 20},
					Logs:       supervisor.DiskBudget{Bytes: 4096, Budget: 16 << 20}, CacheWakes: 5}},
			{Name: "cell-02", Pool: "quarantine-default", Assignment: supervisor.Assigned, State: supervisor.StateDrained, Drained: true, PID: 43},
			{Name: "cell-03", Assignment: supervisor.Unassigned, State: supervisor.StateStopped},
		},
	}
}

func fakeStats() activation.Stats {
	return activation.Stats{
		Last:     activation.Activation{Sequence: 7, Outcome: activation.OutcomeRefused, At: time.Unix(2000, 0), Duration: 1500 * time.Millisecond},
		Outcomes: map[string]int64{activation.OutcomeApplied: 4, activation.OutcomeRefused: 1},
		Refusals: map[string]int64{"signature": 1},
	}
}

// The collector turns a status into the documented series with the right
// values, written as Prometheus parses them, passes client_golang's
// linter, and sends nothing undescribed.
func TestCollectorValues(t *testing.T) {
	c := newCollector(Options{Status: fakeStatus, Activation: fakeStats, ScrapeTimeout: time.Second,
		LogBytes: func(string) (int64, error) { return 100, nil }})
	checkDescribed(t, c)
	reg := gatherer(c)
	want := `
# HELP cellvisor_cell_restarts_total Restarts of the cell: after crashes (kind=crash) and by the operator or control tasks (kind=operator); kept across agent restarts.
# TYPE cellvisor_cell_restarts_total counter
cellvisor_cell_restarts_total{cell="cell-01",kind="crash",pool="shared-default"} 3
cellvisor_cell_restarts_total{cell="cell-01",kind="operator",pool="shared-default"} 1
cellvisor_cell_restarts_total{cell="cell-02",kind="crash",pool="quarantine-default"} 0
cellvisor_cell_restarts_total{cell="cell-02",kind="operator",pool="quarantine-default"} 0
cellvisor_cell_restarts_total{cell="cell-03",kind="crash",pool=""} 0
cellvisor_cell_restarts_total{cell="cell-03",kind="operator",pool=""} 0
# HELP cellvisor_cell_origin_failures_total Passive-origin failures the cell saw while proxying, over every origin (no per-domain series), by reason: connect_failed, connect_timeout, resolve, read_timeout, reset, bad_answer, http_5xx (unknown: counted by a cell that gave none).
# TYPE cellvisor_cell_origin_failures_total counter
cellvisor_cell_origin_failures_total{cell="cell-01",pool="shared-default",reason="bad_answer"} 0
cellvisor_cell_origin_failures_total{cell="cell-01",pool="shared-default",reason="connect_failed"} 0
cellvisor_cell_origin_failures_total{cell="cell-01",pool="shared-default",reason="connect_timeout"} 0
cellvisor_cell_origin_failures_total{cell="cell-01",pool="shared-default",reason="http_5xx"} 3
cellvisor_cell_origin_failures_total{cell="cell-01",pool="shared-default",reason="read_timeout"} 0
cellvisor_cell_origin_failures_total{cell="cell-01",pool="shared-default",reason="reset"} 3
cellvisor_cell_origin_failures_total{cell="cell-01",pool="shared-default",reason="resolve"} 0
cellvisor_cell_origin_failures_total{cell="cell-01",pool="shared-default",reason="unknown"} 1
# HELP cellvisor_cell_disk_unlinked_bytes Of cell_disk_bytes, the bytes in files no longer in the directory, held only by the cell's open descriptors (du does not see them).
# TYPE cellvisor_cell_disk_unlinked_bytes gauge
cellvisor_cell_disk_unlinked_bytes{budget="cache",cell="cell-01",pool="shared-default"} 0
cellvisor_cell_disk_unlinked_bytes{budget="logs",cell="cell-01",pool="shared-default"} 0
cellvisor_cell_disk_unlinked_bytes{budget="request_tmp",cell="cell-01",pool="shared-default"} 2097152
# HELP cellvisor_cell_cache_manager_wakes_total Times the agent woke the cell's cache manager because the cache was over its target (three quarters of limits.cache), since the agent started.
# TYPE cellvisor_cell_cache_manager_wakes_total counter
cellvisor_cell_cache_manager_wakes_total{cell="cell-01",pool="shared-default"} 5
# HELP cellvisor_cell_request_bodies_refused_total Request bodies the cell refused with 503 because they would have taken it past limits.request_tmp.
# TYPE cellvisor_cell_request_bodies_refused_total counter
cellvisor_cell_request_bodies_refused_total{cell="cell-01",pool="shared-default"} 8
# HELP cellvisor_cell_cpu_seconds_total CPU time the cell's cgroup used (cpu.stat usage_usec on v2, cpuacct.usage on v1).
# TYPE cellvisor_cell_cpu_seconds_total counter
cellvisor_cell_cpu_seconds_total{cell="cell-01",pool="shared-default"} 2.5
# HELP cellvisor_cell_drained 1 when the cell is drained by the operator or a control task.
# TYPE cellvisor_cell_drained gauge
cellvisor_cell_drained{cell="cell-01",pool="shared-default"} 0
cellvisor_cell_drained{cell="cell-02",pool="quarantine-default"} 1
cellvisor_cell_drained{cell="cell-03",pool=""} 0
# HELP cellvisor_agent_enrollment_state 1 for the agent's enrollment state, 0 for the others: enrolled, not_enrolled, spool, unusable (enrolled, identity damaged), standalone (no manifest source).
# TYPE cellvisor_agent_enrollment_state gauge
cellvisor_agent_enrollment_state{state="enrolled"} 0
cellvisor_agent_enrollment_state{state="not_enrolled"} 1
cellvisor_agent_enrollment_state{state="spool"} 0
cellvisor_agent_enrollment_state{state="standalone"} 0
cellvisor_agent_enrollment_state{state="unusable"} 0
# HELP cellvisor_activation_last_outcome 1 for the last activation's outcome, 0 for the others: applied, partial, refused, failed.
# TYPE cellvisor_activation_last_outcome gauge
cellvisor_activation_last_outcome{outcome="applied"} 0
cellvisor_activation_last_outcome{outcome="failed"} 0
cellvisor_activation_last_outcome{outcome="partial"} 0
cellvisor_activation_last_outcome{outcome="refused"} 1
# HELP cellvisor_frontdoor_rows Front doors of the edge's org in the cells' runtime file (the last answer taken).
# TYPE cellvisor_frontdoor_rows gauge
cellvisor_frontdoor_rows 3
# HELP cellvisor_frontdoor_fetch_failing 1 when the last front-door fetch failed or its answer was refused (the previous rows stay).
# TYPE cellvisor_frontdoor_fetch_failing gauge
cellvisor_frontdoor_fetch_failing 1
# HELP cellvisor_frontdoor_last_fetch_timestamp_seconds When the control API last confirmed or changed the front doors, as a Unix timestamp.
# TYPE cellvisor_frontdoor_last_fetch_timestamp_seconds gauge
cellvisor_frontdoor_last_fetch_timestamp_seconds 1500
# HELP cellvisor_cell_origin_servers_down Origin servers the cell skips now (their requests kept failing, or their active health check fails), over every origin (which: cellvisor status, origin_servers).
# TYPE cellvisor_cell_origin_servers_down gauge
cellvisor_cell_origin_servers_down{cell="cell-01",pool="shared-default"} 1
# HELP cellvisor_cell_origin_retries_total Requests the cell tried again on another server of their origin, over every origin.
# TYPE cellvisor_cell_origin_retries_total counter
cellvisor_cell_origin_retries_total{cell="cell-01",pool="shared-default"} 3
# HELP cellvisor_cell_origin_health_checks_total Active health checks of origin servers the cell made, by result: passed, failed.
# TYPE cellvisor_cell_origin_health_checks_total counter
cellvisor_cell_origin_health_checks_total{cell="cell-01",pool="shared-default",result="failed"} 3
cellvisor_cell_origin_health_checks_total{cell="cell-01",pool="shared-default",result="passed"} 2
# HELP cellvisor_activation_last_duration_seconds How long the last activation took, from the start of the poll that found it to its ack in the journal.
# TYPE cellvisor_activation_last_duration_seconds gauge
cellvisor_activation_last_duration_seconds 1.5
`
	names := []string{"cellvisor_cell_disk_unlinked_bytes", "cellvisor_cell_cache_manager_wakes_total", "cellvisor_cell_request_bodies_refused_total", "cellvisor_cell_restarts_total", "cellvisor_cell_origin_failures_total", "cellvisor_cell_cpu_seconds_total",
		"cellvisor_cell_drained", "cellvisor_agent_enrollment_state", "cellvisor_activation_last_outcome", "cellvisor_activation_last_duration_seconds",
		"cellvisor_frontdoor_rows", "cellvisor_frontdoor_fetch_failing", "cellvisor_frontdoor_last_fetch_timestamp_seconds",
		"cellvisor_cell_origin_servers_down", "cellvisor_cell_origin_retries_total", "cellvisor_cell_origin_health_checks_total"}
	if err := promtest.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n, err := promtest.GatherAndCount(reg, "cellvisor_activation_refusals_total"); err != nil || n != len(activation.RefusalClasses()) {
		t.Errorf("refusal series %d (%v), want one per class: %d", n, err, len(activation.RefusalClasses()))
	}
	// A stopped cell has no report series; a running one that answered has.
	if n, _ := promtest.GatherAndCount(reg, "cellvisor_cell_report_ok"); n != 2 {
		t.Errorf("report_ok series %d, want 2 (the running cells)", n)
	}
	lintClean(t, reg)
}

// Every metric the collector describes is documented under "## Agent
// metrics" in docs/observability.md, and every one documented there exists.
func TestDocsListEveryMetric(t *testing.T) {
	b, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## Agent metrics")
	end := strings.Index(doc, "## Control API metrics")
	if start < 0 || end < start {
		t.Fatal("docs/observability.md lacks its Agent metrics or Control API metrics heading")
	}
	rows := regexp.MustCompile("(?m)^\\| `(cellvisor_[a-z_]+)` \\|").FindAllStringSubmatch(doc[start:end], -1)
	var documented []string
	for _, r := range rows {
		documented = append(documented, r[1])
	}
	var described []string
	for _, d := range slices.Concat(allDescs, egressDescs, listenerDescs) {
		name := d.Name()
		described = append(described, name)
		if !slices.Contains(documented, name) {
			t.Errorf("%s is not documented in docs/observability.md", name)
		}
	}
	for _, name := range documented {
		if !slices.Contains(described, name) {
			t.Errorf("docs/observability.md documents %s, which the agent does not export", name)
		}
	}
}

// The sample alert rules are valid for promtool.
func TestAlertRulesCheck(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found (make deps installs Debian's prometheus package)")
	}
	if out, err := exec.Command(promtool, "check", "rules", "../docs/alerts/cellvisor.rules.yml").CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
}
