package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/cgroup"
	"cellvisor/supervisor"
	"cellvisor/systemd"
)

// Run runs until ctx is cancelled or Shutdown is called, then stops every
// cell and returns; or, when systemd is restarting the agent's unit and the
// cells have a scope of their own, leaves them running for the next agent
// to adopt.
func (a *Agent) Run(parent context.Context) error {
	ctx, end := context.WithCancel(context.WithoutCancel(parent))
	defer end()
	a.end.Store(&end)
	endDone := make(chan struct{})
	go func() {
		defer close(endDone)
		select {
		case <-parent.Done():
		case <-ctx.Done():
		}
		// Decided before anything sees the end: the cells' goroutines
		// read it when their context ends.
		if a.keepCells() {
			a.sup.LeaveRunning()
		}
		end()
	}()
	defer func() { <-endDone }()
	n := systemd.New(a.log)
	adminCtx, stopAdmin := context.WithCancel(context.Background())
	adminDone := make(chan error, 1)
	go func() { adminDone <- a.admin.Serve(adminCtx) }()
	supDone := make(chan error, 1)
	go func() { supDone <- a.sup.Run(ctx) }()
	go n.Watchdog(ctx, a.health().Check)
	var side sync.WaitGroup
	if a.act != nil {
		side.Add(2)
		go func() {
			defer side.Done()
			a.act.Run(ctx, a.cfg.Source.PollInterval.D(), a.cfg.Source.MaxBackoff.D())
		}()
		go func() {
			defer side.Done()
			a.acks.Run(ctx, a.source.Ack, a.cfg.Source.MaxBackoff.D())
		}()
	}
	if a.metrics != nil {
		side.Add(1)
		go func() { defer side.Done(); a.metrics.Run(ctx) }()
	}
	if a.client != nil {
		side.Add(5)
		go func() { defer side.Done(); a.registerLoop(ctx) }()
		go func() { defer side.Done(); a.taskLoop(ctx) }()
		go func() { defer side.Done(); a.frontDoorLoop(ctx) }()
		go func() { defer side.Done(); a.reportLoop(ctx) }()
		go func() { defer side.Done(); a.renewLoop(ctx) }()
		a.runEgress(ctx, &side)
	}
	defer side.Wait()
	select {
	case <-a.sup.Ready():
		a.limitSelf()
		n.Ready()
		a.log.Info("agent ready", zap.String("summary", a.summary()))
		a.reportStatus(ctx, n)
	case <-ctx.Done():
	}
	n.Stopping()
	<-endDone
	err := <-supDone
	stopAdmin()
	if aerr := <-adminDone; aerr != nil && !errors.Is(aerr, context.Canceled) {
		err = errors.Join(err, aerr)
	}
	if !a.sup.LeftRunning() {
		if a.cfg.Cgroup.Subtree != "" {
			if rerr := a.cg.Remove(); rerr != nil {
				a.log.Debug("remove cgroup subtree", zap.Error(rerr))
			}
		}
		a.releaseScope()
	}
	a.closeScope()
	a.unlock()
	return err
}

// Shutdown ends Run with every cell stopped gracefully, whatever systemd's
// job is (cellvisor shutdown). It returns at once.
func (a *Agent) Shutdown(context.Context) error {
	end := a.end.Load()
	if end == nil {
		return errors.New("the agent is not running yet")
	}
	a.explicitStop.Store(true)
	a.log.Info("shutdown requested: stopping every cell")
	(*end)()
	return nil
}

// unlock releases the state directory and the cgroup subtree, last taken
// first.
func (a *Agent) unlock() {
	for i := len(a.locks) - 1; i >= 0; i-- {
		a.locks[i].Close()
	}
	a.locks = nil
}

// reportStatus keeps systemd's one-line STATUS= current until ctx ends, and
// logs an error when the agent enters the state where none of its assigned
// cells serves (and once it leaves it).
func (a *Agent) reportStatus(ctx context.Context, n *systemd.Notifier) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	last, wasDown := "", false
	for {
		if s := a.summary(); s != last {
			n.Status(s)
			last = s
			if down := strings.HasPrefix(s, notServing); down != wasDown {
				if down {
					a.log.Error("no assigned cell is serving", zap.String("summary", s))
				} else {
					a.log.Info("cells serving again", zap.String("summary", s))
				}
				wasDown = down
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// The prefixes of the summary where assigned cells are not serving: what
// systemctl status shows first (docs/operations.md, "What systemd shows").
const (
	notServing = "NOT SERVING: "
	degraded   = "DEGRADED: "
)

// summary is the agent in one line, from the slots' states alone: it is
// made as the last cell becomes ready, and every two seconds after. Where
// no assigned cell is ready (and not all of them were drained on purpose)
// it starts with NOT SERVING, where some are not, with DEGRADED, each with
// the first such cell's reason.
func (a *Agent) summary() string {
	counts := a.sup.StateCounts()
	total := 0
	for _, n := range counts {
		total += n
	}
	waiting := ""
	if n := counts[supervisor.StateWaiting]; n > 0 {
		waiting = fmt.Sprintf(", %d waiting for their first release", n)
	}
	line := fmt.Sprintf("%d slots: %d ready, %d drained, %d degraded, %d stopped%s; cgroups %s",
		total, counts[supervisor.StateReady], counts[supervisor.StateDrained], counts[supervisor.StateDegraded], counts[supervisor.StateStopped], waiting, a.cg.Mode())
	assigned, ready, drained, first, reason := a.sup.Serving()
	if down := assigned - ready - drained; down > 0 {
		prefix := degraded
		if ready == 0 {
			prefix = notServing
		}
		if len(reason) > 160 {
			reason = reason[:160] + "…"
		}
		line = fmt.Sprintf("%s%d of %d assigned cells ready (%s: %s); %s", prefix, ready, assigned, first, reason, line)
	}
	return line
}

// health watches the supervisor's monitor loop and, when there is a manifest
// source, the activation loop, which marks a heartbeat at the end of every
// poll: a live one is silent at most one poll (poll_timeout, then
// apply_timeout for the cells) and one wait (at most max_backoff), plus a
// minute of slack.
func (a *Agent) health() *systemd.Health {
	h := systemd.NewHealth(nil)
	_, within := a.sup.Heartbeat()
	h.Watch("supervisor", func() time.Time { t, _ := a.sup.Heartbeat(); return t }, within)
	if a.act != nil {
		s := a.cfg.Source
		h.Watch("activation", func() time.Time { t, _ := a.act.LastPoll(); return t },
			s.PollTimeout.D()+s.ApplyTimeout.D()+s.MaxBackoff.D()+time.Minute)
	}
	return h
}

// limitSelf moves the agent into its leaf where it is not there yet (v1)
// and applies the leaf's CPU quota, both held back while the cells started
// (every slot's first outcome is bounded by the readiness timeout). A
// failure is logged, and the agent runs on without that limit.
func (a *Agent) limitSelf() {
	if a.selfLimits == nil {
		return
	}
	if err := a.cg.MoveSelf(); err != nil {
		a.log.Error("move the agent into its own leaf cgroup: it runs without its own limits", zap.Error(err))
		return
	}
	a.weighSelf(cgroup.DefaultWeight)
	if err := a.cg.LimitSelf(*a.selfLimits); err != nil {
		a.log.Warn("apply the agent's own CPU limit", zap.Error(err))
		return
	}
	a.log.Debug("agent CPU limit applied", zap.Int64("quota_us", a.selfLimits.CPUQuotaUS), zap.Uint64("period_us", a.selfLimits.CPUPeriodUS))
}
