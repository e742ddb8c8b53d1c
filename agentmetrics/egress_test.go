package agentmetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"cellvisor/edgeapi"
	"cellvisor/internal/connlimit"
	"cellvisor/outbound"
)

// The egress collector turns the send path's status into one route gauge
// per (class, route), holder-is-me, the lease's epoch and expiry, the
// journal and the deliveries; without a send path it sends nothing.
func TestEgressCollectorValues(t *testing.T) {
	expires := time.Unix(3000, 500_000_000)
	st := &edgeapi.EgressStatus{
		Org: "acme",
		Routes: []edgeapi.RouteStatus{
			{Class: "metering", Route: edgeapi.RouteDirect, Holder: "me", Epoch: 4, Expires: &expires, Pending: 2, Direct: 7, Fallback: 1},
			{Class: "siem_forwarding", Route: edgeapi.RouteProxy, Holder: "other", Epoch: 9, Pending: 0, Forwarded: 3},
		},
		Journal: edgeapi.JournalStatus{Bundles: 2, Bytes: 900, MaxBundles: 100, MaxBytes: 1 << 20, Refused: 5, Damaged: 1},
	}
	var cur *edgeapi.EgressStatus
	c := NewEgressCollector(EgressOptions{Status: func() *edgeapi.EgressStatus { return cur },
		Intake: func() map[string]int64 {
			return map[string]int64{outbound.IntakeAccepted: 6, outbound.IntakeNotHolder: 2}
		}})
	reg := gatherer(c)
	if n, err := promtest.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("%d series (%v) without a send path, want none", n, err)
	}
	cur = st
	checkDescribed(t, c)
	want := `
# HELP cellvisor_egress_lease_holder 1 when this edge holds the class's egress lease (sends direct under its epoch).
# TYPE cellvisor_egress_lease_holder gauge
cellvisor_egress_lease_holder{class="metering"} 1
cellvisor_egress_lease_holder{class="siem_forwarding"} 0
# HELP cellvisor_egress_lease_epoch The fencing epoch of the class's lease as the last election named it (0: no lease).
# TYPE cellvisor_egress_lease_epoch gauge
cellvisor_egress_lease_epoch{class="metering"} 4
cellvisor_egress_lease_epoch{class="siem_forwarding"} 9
# HELP cellvisor_egress_lease_expiry_timestamp_seconds When the class's lease, as the last election named it, expires unless renewed, as a Unix timestamp.
# TYPE cellvisor_egress_lease_expiry_timestamp_seconds gauge
cellvisor_egress_lease_expiry_timestamp_seconds{class="metering"} 3000.5
# HELP cellvisor_egress_bundles_delivered_total Bundles of the class delivered since the agent started, by path: direct (as holder or alone), forwarded (to the holder's intake), fallback (direct after a failed forward or without a lease).
# TYPE cellvisor_egress_bundles_delivered_total counter
cellvisor_egress_bundles_delivered_total{class="metering",path="direct"} 7
cellvisor_egress_bundles_delivered_total{class="metering",path="fallback"} 1
cellvisor_egress_bundles_delivered_total{class="metering",path="forwarded"} 0
cellvisor_egress_bundles_delivered_total{class="siem_forwarding",path="direct"} 0
cellvisor_egress_bundles_delivered_total{class="siem_forwarding",path="fallback"} 0
cellvisor_egress_bundles_delivered_total{class="siem_forwarding",path="forwarded"} 3
# HELP cellvisor_egress_journal_refused_total Bundles refused at the journal's bound since the agent started (produced and forwarded ones).
# TYPE cellvisor_egress_journal_refused_total counter
cellvisor_egress_journal_refused_total 5
# HELP cellvisor_egress_journal_bytes Bytes of the bundles in the egress journal.
# TYPE cellvisor_egress_journal_bytes gauge
cellvisor_egress_journal_bytes 900
# HELP cellvisor_egress_journal_pending Bundles of the class journaled and not yet delivered.
# TYPE cellvisor_egress_journal_pending gauge
cellvisor_egress_journal_pending{class="metering"} 2
cellvisor_egress_journal_pending{class="siem_forwarding"} 0
# HELP cellvisor_egress_error 1 when the egress send path is off or its intake does not listen (cellvisor status says why).
# TYPE cellvisor_egress_error gauge
cellvisor_egress_error 0
`
	names := []string{"cellvisor_egress_lease_holder", "cellvisor_egress_lease_epoch", "cellvisor_egress_lease_expiry_timestamp_seconds",
		"cellvisor_egress_bundles_delivered_total", "cellvisor_egress_journal_refused_total", "cellvisor_egress_journal_bytes",
		"cellvisor_egress_journal_pending", "cellvisor_egress_error"}
	if err := promtest.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n, _ := promtest.GatherAndCount(reg, "cellvisor_egress_route"); n != 8 {
		t.Errorf("%d route series, want 4 routes × 2 classes", n)
	}
	if v := gathered(t, reg, "cellvisor_egress_route", "class", "siem_forwarding", "route", "proxy"); v != 1 {
		t.Errorf("siem_forwarding proxy route %v, want 1", v)
	}
	if n, _ := promtest.GatherAndCount(reg, "cellvisor_egress_intake_requests_total"); n != len(outbound.IntakeResults) {
		t.Errorf("%d intake series, want one per result (%d)", n, len(outbound.IntakeResults))
	}
	if v := gathered(t, reg, "cellvisor_egress_intake_requests_total", "result", outbound.IntakeAccepted); v != 6 {
		t.Errorf("intake accepted %v, want 6", v)
	}
	lintClean(t, reg)
}

// gathered is the value of the one gathered series of name with labels.
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue next
				}
			}
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}

// The listener collector sends each serving listener's connections by
// state, its cap, and its refusals, drops and failed handshakes by reason;
// a listener not serving is left out.
func TestListenerCollectorValues(t *testing.T) {
	st := connlimit.Stats{Open: 10, Pending: 4, Max: 128, RefusedPerIP: 1, RefusedFull: 2, DroppedPerIP: 3, DroppedPending: 4,
		DroppedFull: 5, HandshakeTimeouts: 6, HandshakeFailures: 7}
	c := NewListenerCollector(map[string]func() *connlimit.Stats{
		"intake":  func() *connlimit.Stats { return &st },
		"metrics": func() *connlimit.Stats { return nil },
	})
	reg := gatherer(c)
	checkDescribed(t, c)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"cellvisor_listener_connections", []string{"state", "established"}, 6},
		{"cellvisor_listener_connections", []string{"state", "pending"}, 4},
		{"cellvisor_listener_max_connections", nil, 128},
		{"cellvisor_listener_connections_refused_total", []string{"reason", "per_ip"}, 1},
		{"cellvisor_listener_connections_refused_total", []string{"reason", "full"}, 2},
		{"cellvisor_listener_connections_dropped_total", []string{"reason", "per_ip"}, 3},
		{"cellvisor_listener_connections_dropped_total", []string{"reason", "pending"}, 4},
		{"cellvisor_listener_connections_dropped_total", []string{"reason", "full"}, 5},
		{"cellvisor_listener_handshakes_failed_total", []string{"reason", "timeout"}, 6},
		{"cellvisor_listener_handshakes_failed_total", []string{"reason", "failed"}, 7},
	} {
		if v := gathered(t, reg, tc.name, append([]string{"listener", "intake"}, tc.labels...)...); v != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, v, tc.want)
		}
	}
	if n, _ := promtest.GatherAndCount(reg, "cellvisor_listener_max_connections"); n != 1 {
		t.Errorf("%d listeners, want only the serving intake", n)
	}
	lintClean(t, reg)
}
