package activation

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	active := a.Active()
	if active == 0 {
		// A new edge, or one whose state was lost: a full snapshot, when the
		// source has one, is the quickest way to everything.
		if err := a.recover(ctx); err != nil {
			return err
		}
		active = a.Active()
	}
	m, err := manifest.Collect(ctx, a.o.Source.Page, a.o.EdgeID, active)
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
	pools, err := a.verify(ctx, m, a.o.Source.Artifact)
	if manifest.IsRefusal(err) || errors.Is(err, domain.ErrInvalid) || errors.Is(err, errUnknownPool) {
		return a.refuseManifest(m, err)
	}
	if err != nil {
		return err
	}
	return a.apply(ctx, m.Sequence, pools)
}

var errUnknownPool = errors.New("pool not assigned on this edge")

// recover applies the source's recovery snapshot, if it has one and it was
// not refused already.
func (a *Activator) recover(ctx context.Context) error {
	a.mu.Lock()
	skip := a.snapshotRefused
	a.mu.Unlock()
	if skip {
		return nil
	}
	rc, err := a.o.Source.Snapshot(ctx)
	if errors.Is(err, manifest.ErrNoChange) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open recovery snapshot: %w", err)
	}
	defer rc.Close()
	return a.ApplySnapshot(ctx, rc)
}

// ApplySnapshot applies a full recovery snapshot read from r, with the hard
// bounds of manifest.ReadSnapshot, verifying every artifact against its
// signed entry exactly as for a manifest; a refusal is acknowledged and
// changes nothing.
func (a *Activator) ApplySnapshot(ctx context.Context, r io.Reader) error {
	s, err := manifest.ReadSnapshot(r, manifest.SnapshotLimit)
	if err != nil && !manifest.IsRefusal(err) {
		return fmt.Errorf("recovery snapshot: %w", err) // a broken download: retried
	}
	seq := s.Manifest.Sequence
	if err == nil && s.Manifest.EdgeID != a.o.EdgeID {
		err = fmt.Errorf("%w: snapshot for edge %q, this is %q", manifest.ErrSnapshot, s.Manifest.EdgeID, a.o.EdgeID)
	}
	if active := a.Active(); err == nil && seq <= active {
		err = fmt.Errorf("%w: snapshot sequence %d, active %d", manifest.ErrStale, seq, active)
	}
	if err == nil {
		err = a.authenticate(s.Manifest)
	}
	if err != nil && !manifest.IsRefusal(err) {
		return err // the new pin could not be written: retried
	}
	if err != nil {
		a.mu.Lock()
		a.snapshotRefused = true
		a.mu.Unlock()
		return a.refuse(seq, fmt.Errorf("recovery snapshot: %w", err))
	}
	pools, err := a.verify(ctx, s.Manifest, func(_ context.Context, sum string) ([]byte, error) {
		return s.Artifacts[sum], nil
	})
	if err != nil {
		a.mu.Lock()
		a.snapshotRefused = true
		a.mu.Unlock()
		return a.refuse(seq, fmt.Errorf("recovery snapshot: %w", err))
	}
	a.log.Info("applying recovery snapshot", zap.Int64("sequence", seq), zap.Int("entries", len(s.Manifest.Entries)))
	return a.apply(ctx, seq, pools)
}
