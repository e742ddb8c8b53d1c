package agent

import (
	"testing"

	"cellvisor/agentmetrics"
	"cellvisor/config"
	"cellvisor/outbound"
)

// agent.yaml's connection caps default to what the packages derive from
// the agent's memory (config repeats the numbers: it imports neither).
func TestConnectionDefaultsAreThePackages(t *testing.T) {
	d := config.Default()
	if e := d.Egress; e.IntakeMaxConns != outbound.DefaultIntakeMaxConns || e.IntakeMaxConnsPerIP != outbound.DefaultIntakeMaxConnsPerIP ||
		e.IntakeHandshakeTimeout.D() != outbound.DefaultIntakeHandshakeTimeout {
		t.Errorf("egress intake defaults %d, %d, %s; outbound's %d, %d, %s", e.IntakeMaxConns, e.IntakeMaxConnsPerIP, e.IntakeHandshakeTimeout.D(),
			outbound.DefaultIntakeMaxConns, outbound.DefaultIntakeMaxConnsPerIP, outbound.DefaultIntakeHandshakeTimeout)
	}
	if m := d.Metrics; m.MaxConns != agentmetrics.DefaultMaxConns || m.HandshakeTimeout.D() != agentmetrics.DefaultHandshakeTimeout {
		t.Errorf("metrics defaults %d, %s; agentmetrics' %d, %s", m.MaxConns, m.HandshakeTimeout.D(), agentmetrics.DefaultMaxConns, agentmetrics.DefaultHandshakeTimeout)
	}
}
