package agent

import (
	"fmt"

	"go.uber.org/zap"

	"cellvisor/activation"
	"cellvisor/agentmetrics"
	"cellvisor/internal/connlimit"
	"cellvisor/logbound"
	"cellvisor/runtime"
)

// setupMetrics prepares the Prometheus endpoint when metrics.listen is set;
// Run serves it.
func (a *Agent) setupMetrics(topo runtime.Topology) error {
	if a.cfg.Metrics.Listen == "" {
		return nil
	}
	logs := map[string]string{}
	for _, s := range topo.Slots {
		logs[s.Name] = s.LogsDir()
	}
	o := agentmetrics.Options{
		Status: a.LiveStatus,
		LogBytes: func(cell string) (int64, error) {
			dir, ok := logs[cell]
			if !ok {
				return 0, fmt.Errorf("no slot %s", cell)
			}
			return logbound.Size(dir)
		},
	}
	if a.act != nil {
		o.Activation = func() activation.Stats { return a.act.Stats() }
	}
	if a.egress != nil {
		eo := agentmetrics.EgressOptions{Status: a.egressStatus}
		if s := a.egress.sender; s != nil && a.egress.intake != nil {
			eo.Intake = s.IntakeCounts
		}
		o.Collectors = append(o.Collectors, agentmetrics.NewEgressCollector(eo))
	}
	// The listeners' connection series, read when scraped: a.metrics is
	// set below, before the endpoint serves.
	lst := map[string]func() *connlimit.Stats{"metrics": func() *connlimit.Stats { return bound(a.metrics.ConnStats()) }}
	if a.egress != nil && a.egress.intakeS != nil {
		in := a.egress.intakeS
		lst["intake"] = func() *connlimit.Stats { return bound(in.ConnStats()) }
	}
	o.Collectors = append(o.Collectors, agentmetrics.NewListenerCollector(lst))
	reg, err := agentmetrics.NewRegistry(o)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	log := a.log.Named("metrics")
	lim := agentmetrics.Limits{MaxConns: a.cfg.Metrics.MaxConns, HandshakeTimeout: a.cfg.Metrics.HandshakeTimeout.D()}
	a.metrics = agentmetrics.NewServer(a.cfg.Metrics.Listen, agentmetrics.Handler(reg, log), lim, log.With(zap.String("listen", a.cfg.Metrics.Listen)))
	return nil
}

// bound is st, or nil for a listener not serving (yet).
func bound(st connlimit.Stats) *connlimit.Stats {
	if st.Max == 0 {
		return nil
	}
	return &st
}

// MetricsAddr is the metrics endpoint's bound address, "" while it is not
// bound (off, not yet, or its last bind failed: err says why).
func (a *Agent) MetricsAddr() (string, error) {
	if a.metrics == nil {
		return "", nil
	}
	return a.metrics.Addr()
}
