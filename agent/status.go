package agent

import (
	"context"

	"cellvisor/supervisor"
)

// Status reports the agent.
func (a *Agent) Status() supervisor.Status {
	st := a.sup.Status()
	a.decorate(&st)
	return st
}

// LiveStatus reports the agent with each running cell's own report.
func (a *Agent) LiveStatus(ctx context.Context) supervisor.Status {
	st := a.sup.LiveStatus(ctx)
	a.decorate(&st)
	return st
}

func (a *Agent) decorate(st *supervisor.Status) {
	st.AgentLimits = a.limitsN
	st.Egress = a.egressStatus()
	c := &supervisor.ControlStatus{Enrollment: a.enrollment, Error: a.controlErr}
	st.Control = c
	if a.id != nil {
		c.EdgeID, c.ControlURL = a.id.EdgeID, a.id.ControlURL
	}
	if a.client != nil {
		c.FrontDoors = a.frontDoorStatus()
		if ok, _ := a.client.LastSuccess(); !ok.IsZero() {
			c.LastSuccess = &ok
		}
		a.decorateRenewal(c)
	}
	if a.act == nil {
		return
	}
	at, err := a.act.LastPoll()
	c.ActiveSequence, c.PendingAcks, c.DroppedAcks = a.act.Active(), len(a.acks.Pending()), a.acks.Dropped()
	if !at.IsZero() {
		c.LastPoll = &at
	}
	if err != nil {
		c.LastPollError = err.Error()
	}
}

// Drain, Undrain and Restart control one cell (see supervisor).
func (a *Agent) Drain(ctx context.Context, cell string) (supervisor.SlotStatus, error) {
	return a.sup.Drain(ctx, cell)
}

// Undrain reverses Drain.
func (a *Agent) Undrain(ctx context.Context, cell string) (supervisor.SlotStatus, error) {
	return a.sup.Undrain(ctx, cell)
}

// Restart restarts one cell gracefully.
func (a *Agent) Restart(ctx context.Context, cell string) (supervisor.SlotStatus, error) {
	return a.sup.Restart(ctx, cell)
}

// UpgradeRuntime rolls the cells onto the binary now at the configured
// path, or says what that would do (see supervisor).
func (a *Agent) UpgradeRuntime(ctx context.Context, dryRun bool) (supervisor.UpgradePlan, error) {
	return a.sup.UpgradeRuntime(ctx, dryRun)
}

// Ready is closed once every cell had its first outcome.
func (a *Agent) Ready() <-chan struct{} { return a.sup.Ready() }
