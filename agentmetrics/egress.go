package agentmetrics

import (
	"cellvisor/edgeapi"
	"cellvisor/outbound"
)

// routes are the egress route modes exported one gauge each.
var routes = []string{edgeapi.RouteDirect, edgeapi.RouteProxy, edgeapi.RouteRefused, edgeapi.RouteUnknown}

// The egress series: one set per traffic class the agent sends (a fixed
// set, egress.Class), read from the send path's status when scraped.
var (
	egressError          = desc("egress_error", "1 when the egress send path is off or its intake does not listen (cellvisor status says why).")
	egressRoute          = desc("egress_route", "1 for the class's current route, 0 for the others: direct, proxy, refused, unknown.", "class", "route")
	egressHolder         = desc("egress_lease_holder", "1 when this edge holds the class's egress lease (sends direct under its epoch).", "class")
	egressEpoch          = desc("egress_lease_epoch", "The fencing epoch of the class's lease as the last election named it (0: no lease).", "class")
	egressExpiry         = desc("egress_lease_expiry_timestamp_seconds", "When the class's lease, as the last election named it, expires unless renewed, as a Unix timestamp.", "class")
	egressPending        = desc("egress_journal_pending", "Bundles of the class journaled and not yet delivered.", "class")
	egressDelivered      = desc("egress_bundles_delivered_total", "Bundles of the class delivered since the agent started, by path: direct (as holder or alone), forwarded (to the holder's intake), fallback (direct after a failed forward or without a lease).", "class", "path")
	egressJournalBundles = desc("egress_journal_bundles", "Bundles in the egress journal, every class.")
	egressJournalBytes   = desc("egress_journal_bytes", "Bytes of the bundles in the egress journal.")
	egressJournalMaxB    = desc("egress_journal_max_bundles", "The egress journal's bound in bundles.")
	egressJournalMaxBy   = desc("egress_journal_max_bytes", "The egress journal's bound in bytes.")
	egressJournalRefused = desc("egress_journal_refused_total", "Bundles refused at the journal's bound since the agent started (produced and forwarded ones).")
	egressJournalDamaged = desc("egress_journal_damaged", "Journal files set aside as unreadable when the agent started.")
	egressIntake         = desc("egress_intake_requests_total", "Forwards this edge's intake answered since the agent started, by result: accepted, or the refusal's reason.", "result")

	egressDescs = []*Desc{egressError, egressRoute, egressHolder, egressEpoch, egressExpiry, egressPending, egressDelivered,
		egressJournalBundles, egressJournalBytes, egressJournalMaxB, egressJournalMaxBy, egressJournalRefused, egressJournalDamaged, egressIntake}
)

// EgressOptions configures NewEgressCollector.
type EgressOptions struct {
	// Status reads the send path's status, or returns nil when the agent
	// runs none (no series then). Required.
	Status func() *edgeapi.EgressStatus
	// Intake returns the intake's answers by result
	// (outbound.IntakeResults), or nil to leave the intake series out.
	Intake func() map[string]int64
}

// NewEgressCollector returns the collector of the agent's governed-egress
// series, for Options.Collectors.
func NewEgressCollector(o EgressOptions) Collector { return &egressCollector{o: o} }

type egressCollector struct{ o EgressOptions }

var _ Collector = (*egressCollector)(nil)

func (c *egressCollector) Describe() []*Desc { return egressDescs }

func (c *egressCollector) Collect(emit func(sample)) {
	st := c.o.Status()
	if st == nil {
		return
	}
	gauge(emit, egressError, b2f(st.Error != ""))
	for _, r := range st.Routes {
		for _, mode := range routes {
			gauge(emit, egressRoute, b2f(r.Route == mode), r.Class, mode)
		}
		gauge(emit, egressHolder, b2f(r.Route == edgeapi.RouteDirect && r.Epoch > 0), r.Class)
		gauge(emit, egressEpoch, float64(r.Epoch), r.Class)
		if r.Expires != nil {
			gauge(emit, egressExpiry, unix(*r.Expires), r.Class)
		}
		gauge(emit, egressPending, float64(r.Pending), r.Class)
		counter(emit, egressDelivered, float64(r.Direct), r.Class, "direct")
		counter(emit, egressDelivered, float64(r.Forwarded), r.Class, "forwarded")
		counter(emit, egressDelivered, float64(r.Fallback), r.Class, "fallback")
	}
	j := st.Journal
	gauge(emit, egressJournalBundles, float64(j.Bundles))
	gauge(emit, egressJournalBytes, float64(j.Bytes))
	gauge(emit, egressJournalMaxB, float64(j.MaxBundles))
	gauge(emit, egressJournalMaxBy, float64(j.MaxBytes))
	counter(emit, egressJournalRefused, float64(j.Refused))
	gauge(emit, egressJournalDamaged, float64(j.Damaged))
	if c.o.Intake == nil {
		return
	}
	counts := c.o.Intake()
	for _, r := range outbound.IntakeResults {
		counter(emit, egressIntake, float64(counts[r]), r)
	}
}
