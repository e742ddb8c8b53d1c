package activation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"cellvisor/domain"
	"cellvisor/internal/backoff"
	"cellvisor/manifest"
)

// Run polls every interval (with jittered backoff up to maxDelay while the
// source fails) until ctx ends. Cells keep serving the last good release
// whatever happens here.
func (a *Activator) Run(ctx context.Context, interval, maxDelay time.Duration) {
	b := &backoff.Backoff{Initial: interval, Max: maxDelay, Clock: a.clock}
	for {
		err := a.Poll(ctx)
		a.mu.Lock()
		a.lastPoll, a.lastErr = a.clock.Now(), err
		if err == nil {
			a.stats.LastSuccess = a.lastPoll
		}
		a.mu.Unlock()
		var wait time.Duration
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			wait = b.Next()
			a.log.Warn("poll failed; keeping the active release", zap.Duration("retry_in", wait), zap.Error(err))
		} else {
			b.Reset()
			wait = b.Steady()
		}
		if backoff.Sleep(ctx, a.clock, wait) != nil {
			return
		}
	}
}

// Poll applies the newest manifest after the active sequence, if any. It
// returns an error only for failures to be retried (source unreachable,
// local I/O); refusals are journaled as acks and return nil.
func (a *Activator) Poll(ctx context.Context) error {
	a.begin()
	fctx, cancel := a.fetchContext(ctx)
	defer cancel()
	active := a.Active()
	if active == 0 {
		// A new edge, or one whose state was lost: a full snapshot, when the
		// source has one, is the quickest way to everything.
		if err := a.recover(ctx, fctx); err != nil {
			return err
		}
		if a.Active() != 0 {
			// Recovered: this poll ends (and counts) now; the next asks
			// for anything newer, and may be held (a long poll) then.
			return nil
		}
	}
	m, err := manifest.Collect(fctx, a.o.Source.Page, a.o.EdgeID, active)
	if err == nil {
		err = a.authenticate(m)
	}
	switch {
	case errors.Is(err, manifest.ErrNoChange):
		return nil
	case err != nil && !manifest.IsRefusal(err):
		return fmt.Errorf("fetch manifest: %w", err)
	}
	if err != nil {
		return a.refuse(m.Sequence, err)
	}
	if a.alreadyRefused(m) {
		return nil
	}
	pl, done, err := a.verify(fctx, m, a.o.Source.Artifact)
	if manifest.IsRefusal(err) || errors.Is(err, domain.ErrInvalid) || errors.Is(err, errUnknownPool) {
		return a.refuseManifest(m, err)
	}
	if err != nil {
		return err
	}
	defer done()
	if err := a.apply(ctx, m.Sequence, pl); err != nil {
		a.note(m.Sequence, OutcomeFailed)
		return err
	}
	return nil
}

var errUnknownPool = errors.New("pool not assigned on this edge")
