package activation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"cellvisor/domain"
	"cellvisor/manifest"
)

// DefaultPollTimeout bounds what one poll fetches when Options.PollTimeout
// is zero: every page, every artifact and the recovery snapshot together.
// It is the bound the snapshot's download alone had before, so that a
// recovery that fitted then fits now.
const DefaultPollTimeout = 10 * time.Minute

// fetchContext is ctx with the poll's overall deadline, for everything a
// poll fetches and reads (pages, artifacts, the snapshot) but not for the
// installation that follows: a slow source makes the poll fail and be
// retried, never cuts an activation in the middle.
func (a *Activator) fetchContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, a.o.PollTimeout,
		fmt.Errorf("poll deadline of %s exceeded (source.poll_timeout)", a.o.PollTimeout))
}

// recover applies the source's recovery snapshot, if it has one and it was
// not refused already: read and verified under fctx, the poll's deadline,
// applied under ctx. A snapshot the source refuses to open (a spool file
// that is a link, a FIFO or over its bound) is refused like a bad one, so
// that the edge pages through the manifest instead.
func (a *Activator) recover(ctx, fctx context.Context) error {
	a.mu.Lock()
	skip := a.snapshotRefused
	a.mu.Unlock()
	if skip {
		return nil
	}
	rc, err := a.o.Source.Snapshot(fctx)
	switch {
	case errors.Is(err, manifest.ErrNoChange):
		return nil
	case errors.Is(err, manifest.ErrSnapshotBusy):
		// Not served now (the control API's slots, or this edge's or
		// its org's share of them): page the manifest in this poll
		// rather than wait for a slot (issue 32 §3). Not a refusal: a
		// later recovery asks for the snapshot again.
		a.log.Info("recovery snapshot not served now; paging the manifest", zap.Error(err))
		return nil
	case manifest.IsRefusal(err):
		return a.refuseSnapshot(0, err)
	case err != nil:
		return fmt.Errorf("open recovery snapshot: %w", cause(fctx, err))
	}
	defer rc.Close()
	return a.applySnapshot(ctx, fctx, rc)
}

// cause names the poll's deadline when it is what ended err.
func cause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil && ctx.Err() != nil && !errors.Is(err, c) {
		return fmt.Errorf("%w (%v)", err, c)
	}
	return err
}

// ApplySnapshot applies a full recovery snapshot read from r, with the hard
// bounds of manifest.ReadSnapshot, verifying every artifact against its
// signed entry exactly as for a manifest; a refusal is acknowledged and
// changes nothing.
func (a *Activator) ApplySnapshot(ctx context.Context, r io.Reader) error {
	a.begin()
	fctx, cancel := a.fetchContext(ctx)
	defer cancel()
	return a.applySnapshot(ctx, fctx, r)
}

// snapshotStaging is where a snapshot is read to, under the state
// directory: on the filesystem the releases are written to, and not in a
// tmpfs that would count against the agent's memory.
func (a *Activator) snapshotStaging() string { return filepath.Join(a.o.StateDir, "snapshot-staging") }

func (a *Activator) applySnapshot(ctx, fctx context.Context, r io.Reader) error {
	// Whatever an earlier read left behind (a crash) goes first.
	if err := os.RemoveAll(a.snapshotStaging()); err != nil {
		return fmt.Errorf("recovery snapshot: %w", err)
	}
	if err := os.MkdirAll(a.snapshotStaging(), 0o700); err != nil {
		return fmt.Errorf("recovery snapshot: %w", err)
	}
	defer os.RemoveAll(a.snapshotStaging())
	s, err := manifest.ReadSnapshot(fctx, r, manifest.SnapshotLimit, a.snapshotStaging())
	if err != nil && (fctx.Err() != nil || !manifest.IsRefusal(err)) {
		// A broken download, or one the poll's deadline cut (the stream
		// may then just end, and read as a snapshot missing its
		// artifacts): retried, never refused.
		if fctx.Err() != nil && !errors.Is(err, fctx.Err()) {
			err = fmt.Errorf("%w: %w", fctx.Err(), err)
		}
		return fmt.Errorf("recovery snapshot: %w", cause(fctx, err))
	}
	if err != nil {
		return a.refuseSnapshot(0, err)
	}
	defer s.Close()
	seq := s.Manifest.Sequence
	if s.Manifest.EdgeID != a.o.EdgeID {
		return a.refuseSnapshot(seq, fmt.Errorf("%w: snapshot for edge %q, this is %q", manifest.ErrSnapshot, s.Manifest.EdgeID, a.o.EdgeID))
	}
	if active := a.Active(); seq <= active {
		return a.refuseSnapshot(seq, fmt.Errorf("%w: snapshot sequence %d, active %d", manifest.ErrStale, seq, active))
	}
	if err := a.authenticate(s.Manifest); err != nil {
		if !manifest.IsRefusal(err) {
			return err // the new pin could not be written: retried
		}
		return a.refuseSnapshot(seq, err)
	}
	// Each artifact is read back from the staging directory and verified
	// against its signed entry, as a fetched one is: memory holds one
	// artifact per verifying worker, never the whole snapshot.
	pl, done, err := a.verify(fctx, s.Manifest, s.Artifact)
	if err != nil && (fctx.Err() != nil || !isRefusal(err)) {
		return fmt.Errorf("recovery snapshot: %w", cause(fctx, err))
	}
	if err != nil {
		return a.refuseSnapshot(seq, err)
	}
	defer done()
	a.log.Info("applying recovery snapshot", zap.Int64("sequence", seq), zap.Int("entries", len(s.Manifest.Entries)))
	if err := a.apply(ctx, seq, pl); err != nil {
		a.note(seq, OutcomeFailed)
		return err
	}
	return nil
}

// refuseSnapshot refuses a snapshot once: the edge pages the manifest
// instead.
func (a *Activator) refuseSnapshot(seq int64, why error) error {
	a.mu.Lock()
	a.snapshotRefused = true
	a.mu.Unlock()
	return a.refuse(seq, fmt.Errorf("recovery snapshot: %w", why))
}

// isRefusal tells a verification's refusal of the content from a failure
// to read it.
func isRefusal(err error) bool {
	return manifest.IsRefusal(err) || errors.Is(err, domain.ErrInvalid) || errors.Is(err, errUnknownPool)
}

// compact drops a verified domain's decoded routes, origins and cache
// policy: from here on only its names and its canonical encoding are used
// (the pool runtime JSON splices the canonical document, which verify then
// moves to disk), and holding every domain's configuration twice, decoded
// and encoded, doubled an activation's memory.
func compact(d domain.Domain) domain.Domain {
	if d.Canonical() != nil {
		// The cache policy stays: the release renders a cached origin
		// location for each TTL.
		d.Origins, d.Routes = checkedOrigins(d.Origins), nil
	}
	return d
}
