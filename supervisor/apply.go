package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"cellvisor/cellapi"
	"cellvisor/runtime"
)

// How a cell took its switched release (Applied.How).
const (
	// HowLoaded: the running worker read the release's data and serves
	// it; no connection was touched.
	HowLoaded = "loaded"
	// HowReloaded: a graceful reload (new workers; the old ones finish
	// their requests within worker_shutdown_timeout).
	HowReloaded = "reloaded"
	// HowStarted: the cell was not running; it starts on the release.
	HowStarted = "started"
)

// Applied is how a cell took its last switched release.
type Applied struct {
	Sequence int64     `json:"sequence"`
	How      string    `json:"how"`
	Why      string    `json:"why,omitempty"` // why a reload rather than a load
	At       time.Time `json:"at"`
}

// String is How, with Why where there is one.
func (a Applied) String() string {
	if a.Why == "" {
		return a.How
	}
	return a.How + ": " + a.Why
}

// Apply makes a cell serve its switched release: a running cell whose
// configuration has the release's shape loads it as data, without a
// reload (its connections untouched); any other (the configuration
// changed, the cell could not load it, it was mid-reload or not yet
// answering) is reloaded gracefully, and one not running starts on it.
// ctx bounds the questions to the cell; the reload itself is a signal.
// It answers how (Applied.String); status keeps it (SlotStatus.Applied).
func (s *Supervisor) Apply(ctx context.Context, name string) (string, error) {
	a, err := s.apply(ctx, name)
	return a.String(), err
}

func (s *Supervisor) apply(ctx context.Context, name string) (Applied, error) {
	c, err := s.slotNamed(name)
	if err != nil {
		return Applied{}, err
	}
	meta, err := runtime.Current(c.spec)
	if err != nil {
		return Applied{}, fmt.Errorf("apply %s: %w", name, err)
	}
	a := Applied{Sequence: meta.Sequence, How: HowLoaded, At: s.clk.Now()}
	why := c.loadable(meta)
	if why == "" {
		api, err := c.client()
		var cs cellapi.Status
		if err == nil {
			cs, err = api.Load(ctx, meta.ID)
		}
		if err == nil {
			c.confirm(cs.Sequence)
			c.applied(a)
			return a, nil
		}
		var r *cellapi.Refusal
		switch {
		case errors.As(err, &r) && r.Kind == cellapi.RefusedReload:
			why = "configuration changed"
		case errors.Is(err, cellapi.ErrNoSuchCall):
			why = "the running cell cannot load releases"
		case errors.As(err, &r):
			why = "the cell did not load it: " + r.Reason
			c.log.Warn("cell did not load its release; reloading it", zap.Int64("sequence", meta.Sequence), zap.Error(err))
		default:
			why = "load: " + err.Error()
			c.log.Warn("cell did not load its release; reloading it", zap.Int64("sequence", meta.Sequence), zap.Error(err))
		}
	}
	a.How, a.Why = HowReloaded, why
	if pid, _ := c.running(); pid == 0 {
		a.How, a.Why = HowStarted, ""
	}
	if err := s.Reload(name); err != nil {
		return a, err
	}
	c.applied(a)
	return a, nil
}

// loadable says why the running cell cannot be asked to load meta as
// data, "" where it can: it runs, has answered, has no reload in flight,
// and meta says its shape. The cell itself compares the shapes (and
// refuses another's, RefusedReload): no status call first.
func (c *slot) loadable(meta runtime.ReleaseMeta) string {
	c.mu.Lock()
	pid, answered, pending := c.pid, c.answered, c.reloadPending
	c.mu.Unlock()
	switch {
	case pid == 0:
		return "not running"
	case !answered || pending:
		return "starting"
	case meta.Shape == "":
		return "the release does not say its shape"
	case !c.settled():
		return "a reload is in flight"
	}
	return ""
}

// applied records how the cell took its release, for status and the log.
func (c *slot) applied(a Applied) {
	c.mu.Lock()
	c.lastApply = &a
	c.switchToLocked(a.Sequence)
	c.mu.Unlock()
	c.log.Info("release applied", zap.Int64("sequence", a.Sequence), zap.String("how", a.How), zap.String("why", a.Why))
}
