package agent

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"cellvisor/edgeapi"
	"cellvisor/internal/backoff"
	"cellvisor/supervisor"
)

// Enrollment states shown in status.
const (
	EnrollmentNone     = "not enrolled"
	EnrollmentEnrolled = "enrolled"
	EnrollmentSpool    = "spool"
	// EnrollmentUnusable: enrolled, but the identity files are damaged.
	EnrollmentUnusable = "unusable"
)

// errUnusable marks identity files that exist but cannot be used.
var errUnusable = errors.New("enrolled identity unusable")

// enrolled returns the identity and pinned key when this edge is enrolled
// with a control API, nil when it is not enrolled at all.
func (a *Agent) enrolled() (*Identity, ed25519.PublicKey, error) {
	if _, err := os.Stat(a.cfg.Identity()); os.IsNotExist(err) {
		return nil, nil, nil
	}
	id, key, err := LoadIdentity(a.cfg.Identity())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errUnusable, err)
	}
	if id.ControlURL == "" {
		return nil, nil, nil
	}
	if id.Slots != 0 && id.Slots != a.cfg.Slots {
		return nil, nil, fmt.Errorf("edge %s was created with %d slots, the configuration says %d", id.EdgeID, id.Slots, a.cfg.Slots)
	}
	return &id, key, nil
}

// taskLoop runs control tasks: when a poll says some are pending, and
// every few poll intervals in case a signal was missed; a failed fetch is
// retried with backoff. A task's outcome is in the ledger before its ack is
// sent, so a task whose ack was not taken is acked again, not run again,
// even after an agent restart.
func (a *Agent) taskLoop(ctx context.Context) {
	every := 10 * a.cfg.Source.PollInterval.D()
	b := &backoff.Backoff{Initial: a.cfg.Source.PollInterval.D(), Max: a.cfg.Source.MaxBackoff.D()}
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.client.TasksPending():
		case <-t.C:
		}
		t.Reset(every)
		tasks, err := a.client.Tasks(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			delay := b.Next()
			a.log.Warn("fetch control tasks", zap.Duration("retry_in", delay), zap.Error(err))
			if backoff.Sleep(ctx, nil, delay) != nil {
				return
			}
			continue
		}
		b.Reset()
		for _, task := range tasks {
			a.handleTask(ctx, task)
		}
	}
}

// handleTask runs a task once (or takes its recorded outcome) and acks it.
func (a *Agent) handleTask(ctx context.Context, task edgeapi.Task) {
	ack, ok := a.tasks.outcome(task.ID)
	if !ok {
		ack = a.runTask(ctx, task)
		if err := a.tasks.record(task.ID, ack); err != nil {
			a.log.Error("record control task outcome", zap.Int64("task", task.ID), zap.Error(err))
		}
		a.report(ctx) // the control plane sees the new state at once
	}
	if err := a.client.AckTask(ctx, task.ID, ack); err != nil {
		a.log.Warn("acknowledge control task", zap.Int64("task", task.ID), zap.Error(err))
		return
	}
	if err := a.tasks.forget(task.ID); err != nil {
		a.log.Error("record control task outcome", zap.Int64("task", task.ID), zap.Error(err))
	}
}

// taskTimeout bounds one control task: a restart drains, stops and waits
// for the new cell's readiness. The drain timeout is the supervisor's, which
// a reload (SIGHUP) changes; a.cfg keeps the configuration the agent started
// with, and the stop and ready timeouts cannot be reloaded.
func (a *Agent) taskTimeout() time.Duration {
	return a.sup.DrainTimeout() + a.cfg.OpenResty.StopTimeout.D() + a.cfg.OpenResty.ReadyTimeout.D() + 30*time.Second
}

// runTask runs one control task through the same paths as the CLI.
func (a *Agent) runTask(ctx context.Context, t edgeapi.Task) edgeapi.TaskAck {
	log := a.log.With(zap.Int64("task", t.ID), zap.String("cell", t.Cell), zap.String("action", t.Action))
	tctx, cancel := context.WithTimeout(ctx, a.taskTimeout())
	defer cancel()
	var st supervisor.SlotStatus
	var err error
	switch t.Action {
	case edgeapi.ActionDrain:
		st, err = a.Drain(tctx, t.Cell)
	case edgeapi.ActionUndrain:
		st, err = a.Undrain(tctx, t.Cell)
	case edgeapi.ActionRestart:
		st, err = a.Restart(tctx, t.Cell)
	default:
		err = fmt.Errorf("unknown action %q", t.Action)
	}
	if err != nil {
		log.Warn("control task failed", zap.Error(err))
		return edgeapi.TaskAck{State: edgeapi.TaskFailed, Result: err.Error()}
	}
	log.Info("control task done", zap.String("state", string(st.State)))
	return edgeapi.TaskAck{State: edgeapi.TaskDone, Result: string(st.State)}
}

// reportLoop looks at the agent's status every status interval (jittered,
// so a fleet restarted together spreads out) and sends it to the control
// API when it changed, or when the control API's status interval passed
// (controlclient.ReportChanged): the poll is the heartbeat.
func (a *Agent) reportLoop(ctx context.Context) {
	d := a.cfg.Source.StatusInterval.D()
	b := &backoff.Backoff{Initial: d, Max: d + d/2}
	for {
		a.report(ctx)
		if backoff.Sleep(ctx, nil, b.Steady()) != nil {
			return
		}
	}
}

func (a *Agent) report(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st := a.LiveStatus(rctx)
	// The control API gets each cell's certificates summed up (how many,
	// the one that expires first), not the list: a cell may present
	// thousands, and a report is bounded (edgeapi.MaxStatusBytes).
	for i, sl := range st.Slots {
		if sl.Cell != nil && len(sl.Cell.TLS.Certificates) > 0 {
			c := *sl.Cell
			c.TLS.Summarize()
			st.Slots[i].Cell = &c
		}
	}
	data, err := json.Marshal(st)
	if err != nil {
		return
	}
	start := time.Now()
	sent, err := a.client.ReportChanged(rctx, edgeapi.StatusReport{At: start.UTC(), Status: data, Gateways: a.gateways(st)})
	if sent && err == nil {
		a.rtt.Store(time.Since(start).Microseconds())
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		a.log.Debug("status report", zap.Error(err))
	}
}
