package agentmetrics

import (
	"sort"

	"cellvisor/internal/connlimit"
)

// The listener series: one set per listener the agent serves (intake,
// metrics), read from its connection bounds when scraped (issue 32 §1).
var (
	listenerConns    = desc("listener_connections", "Connections the listener holds open, by state: established (through the handshake, or for metrics a first request) and pending (not yet).", "listener", "state")
	listenerMax      = desc("listener_max_connections", "The listener's cap on connections open at once.", "listener")
	listenerRefused  = desc("listener_connections_refused_total", "New connections closed at once since the agent started, by reason: per_ip (the address holds its cap, all established), full (the listener holds its cap, all established).", "listener", "reason")
	listenerDropped  = desc("listener_connections_dropped_total", "Pending connections closed to make room for a new one since the agent started, the oldest first, by the cap reached: per_ip, pending, full.", "listener", "reason")
	listenerHandshak = desc("listener_handshakes_failed_total", "Connections closed before they were established since the agent started, by reason: timeout (the handshake deadline), failed (a TLS handshake that failed: no or a bad client certificate).", "listener", "reason")

	listenerDescs = []*Desc{listenerConns, listenerMax, listenerRefused, listenerDropped, listenerHandshak}
)

// NewListenerCollector returns the collector of the listeners' connection
// series, for Options.Collectors: stats maps a listener's name to its
// counts, read at scrape time; a nil function is left out (a listener not
// serving).
func NewListenerCollector(stats map[string]func() *connlimit.Stats) Collector {
	return &listenerCollector{stats: stats}
}

type listenerCollector struct {
	stats map[string]func() *connlimit.Stats
}

var _ Collector = (*listenerCollector)(nil)

func (c *listenerCollector) Describe() []*Desc { return listenerDescs }

func (c *listenerCollector) Collect(emit func(sample)) {
	names := make([]string, 0, len(c.stats))
	for n := range c.stats {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f := c.stats[n]
		if f == nil {
			continue
		}
		st := f()
		if st == nil {
			continue
		}
		gauge(emit, listenerConns, float64(st.Open-st.Pending), n, "established")
		gauge(emit, listenerConns, float64(st.Pending), n, "pending")
		gauge(emit, listenerMax, float64(st.Max), n)
		counter(emit, listenerRefused, float64(st.RefusedPerIP), n, "per_ip")
		counter(emit, listenerRefused, float64(st.RefusedFull), n, "full")
		counter(emit, listenerDropped, float64(st.DroppedPerIP), n, "per_ip")
		counter(emit, listenerDropped, float64(st.DroppedPending), n, "pending")
		counter(emit, listenerDropped, float64(st.DroppedFull), n, "full")
		counter(emit, listenerHandshak, float64(st.HandshakeTimeouts), n, "timeout")
		counter(emit, listenerHandshak, float64(st.HandshakeFailures), n, "failed")
	}
}
