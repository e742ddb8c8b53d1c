package agent

import (
	"context"

	"cellvisor/controlclient"
	"cellvisor/supervisor"
)

// renewLoop keeps the edge's client certificate renewed (see
// controlclient.RunRenewal): between 70 % and 90 % of its lifetime,
// retried with backoff, switched to atomically.
func (a *Agent) renewLoop(ctx context.Context) {
	a.client.RunRenewal(ctx, controlclient.RenewOptions{RetryMax: a.cfg.Source.MaxBackoff.D()})
}

// decorateRenewal shows the certificate's expiry and the next renewal.
func (a *Agent) decorateRenewal(c *supervisor.ControlStatus) {
	if a.client == nil {
		return
	}
	r := a.client.Renewal()
	if !r.CertExpires.IsZero() {
		c.CertExpires = &r.CertExpires
	}
	if !r.Next.IsZero() {
		c.NextRenewal = &r.Next
	}
	c.RenewalError = r.LastError
}
