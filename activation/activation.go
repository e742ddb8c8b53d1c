// Package activation turns an edge's manifest into running configuration.
// One Poll pulls every page after the active sequence, fetches and verifies
// every artifact (size, SHA-256, Ed25519 by the pinned key), decodes and
// compiles the domains into per-pool runtime JSON, installs a complete
// release for every slot whose content changed, switches those slots
// atomically, reloads only those cells, waits until each reports the new
// sequence, and journals the acknowledgement. Everything is verified before
// anything is written, so a refusal leaves the previous release active and
// untouched and journals a refusal ack instead.
package activation

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlclient"
	"cellvisor/domain"
	"cellvisor/internal/atomicfile"
	"cellvisor/manifest"
	"cellvisor/runtime"
)

// Cells is the part of the supervisor activation drives.
type Cells interface {
	// Reload makes a cell load its switched release: a graceful reload of a
	// running cell, a start of one that waited for a release.
	Reload(cell string) error
	// Loaded returns the release sequence a running, ready cell reports
	// having loaded (from its private status); running is false otherwise.
	Loaded(ctx context.Context, cell string) (seq int64, running bool, err error)
}

// Options configures an Activator.
type Options struct {
	// EdgeID and PublicKey come from the agent's identity: entries must be
	// signed for this edge by this key. Required.
	EdgeID    string
	PublicKey ed25519.PublicKey
	// Source serves manifests and artifacts and takes acks. Required.
	Source manifest.Source
	// Journal makes acks durable. Required.
	Journal *controlclient.Journal
	// Topology and Assignments say which slots serve which pool. Required.
	Topology    runtime.Topology
	Assignments runtime.Assignments
	// Render gives the render inputs of a slot's release. Required.
	Render func(s runtime.Slot, pool string, seq int64) runtime.RenderParams
	// Cells reloads cells and reports what they loaded. Required.
	Cells Cells
	// StateDir holds active.json, the active sequence. Required.
	StateDir string
	// ApplyTimeout bounds the wait for cells to report a new release; zero
	// means 30s.
	ApplyTimeout time.Duration
	// PollTimeout bounds what one poll fetches, all together (see
	// fetchContext); zero means DefaultPollTimeout.
	PollTimeout time.Duration
	// Logger, or nil for none.
	Logger *zap.Logger
}

// Activator applies manifests.
type Activator struct {
	o   Options
	log *zap.Logger

	mu       sync.Mutex // guards the following fields
	active   int64
	refused  string // sequence and reason of the last refusal acknowledged
	lastPoll time.Time
	lastErr  error
	// snapshotRefused stops re-reading a snapshot already refused.
	snapshotRefused bool
}

type activeFile struct {
	Sequence int64 `json:"sequence"`
}

// New loads the active sequence and validates options.
func New(o Options) (*Activator, error) {
	if o.EdgeID == "" || len(o.PublicKey) != ed25519.PublicKeySize || o.Source == nil || o.Journal == nil ||
		o.Render == nil || o.Cells == nil || o.StateDir == "" {
		return nil, errors.New("activation: EdgeID, PublicKey, Source, Journal, Render, Cells and StateDir are required")
	}
	if o.ApplyTimeout == 0 {
		o.ApplyTimeout = 30 * time.Second
	}
	if o.PollTimeout == 0 {
		o.PollTimeout = DefaultPollTimeout
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	a := &Activator{o: o, log: o.Logger.Named("activation")}
	data, err := os.ReadFile(a.activePath())
	switch {
	case err == nil:
		var f activeFile
		if err := json.Unmarshal(data, &f); err != nil {
			return nil, fmt.Errorf("read active sequence: %w", err)
		}
		a.active = f.Sequence
	case !os.IsNotExist(err):
		return nil, fmt.Errorf("read active sequence: %w", err)
	}
	return a, nil
}

func (a *Activator) activePath() string { return filepath.Join(a.o.StateDir, "active.json") }

// Active returns the active sequence.
func (a *Activator) Active() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.active
}

// LastPoll returns when the last poll finished and its error, if any.
func (a *Activator) LastPoll() (time.Time, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastPoll, a.lastErr
}

// Run polls every interval (with jittered backoff up to maxDelay while the
// source fails) until ctx ends. Cells keep serving the last good release
// whatever happens here.
func (a *Activator) Run(ctx context.Context, interval, maxDelay time.Duration) {
	delay := interval
	for {
		err := a.Poll(ctx)
		a.mu.Lock()
		a.lastPoll, a.lastErr = time.Now(), err
		a.mu.Unlock()
		wait := interval
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			wait = delay
			a.log.Warn("poll failed; keeping the active release", zap.Duration("retry_in", wait), zap.Error(err))
			delay = min(delay*2, maxDelay)
		} else {
			delay = interval
		}
		t := time.NewTimer(time.Duration(float64(wait) * (0.75 + rand.Float64()/2)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Poll applies the newest manifest after the active sequence, if any. It
// returns an error only for failures to be retried (source unreachable,
// local I/O); refusals are journaled as acks and return nil.
func (a *Activator) Poll(ctx context.Context) error {
	fctx, cancel := a.fetchContext(ctx)
	defer cancel()
	active := a.Active()
	if active == 0 {
		// A new edge, or one whose state was lost: a full snapshot, when the
		// source has one, is the quickest way to everything.
		if err := a.recover(ctx, fctx); err != nil {
			return err
		}
		active = a.Active()
	}
	m, err := manifest.Collect(fctx, a.o.Source.Page, a.o.EdgeID, active)
	switch {
	case errors.Is(err, manifest.ErrNoChange):
		return nil
	case err != nil && !manifest.IsRefusal(err):
		return fmt.Errorf("fetch manifest: %w", err)
	}
	if err != nil {
		return a.refuse(m.Sequence, err)
	}
	if a.alreadyRefused(m.Sequence) {
		return nil
	}
	pools, err := a.verify(fctx, m, a.o.Source.Artifact)
	if manifest.IsRefusal(err) || errors.Is(err, domain.ErrInvalid) || errors.Is(err, errUnknownPool) {
		return a.refuse(m.Sequence, err)
	}
	if err != nil {
		return err
	}
	return a.apply(ctx, m.Sequence, pools)
}

var errUnknownPool = errors.New("pool not assigned on this edge")

// verify fetches every artifact and checks it against its signed entry,
// decodes it, and compiles the pools. It writes nothing.
func (a *Activator) verify(ctx context.Context, m manifest.Manifest, fetch func(context.Context, string) ([]byte, error)) (map[string]*runtime.PoolRuntime, error) {
	assigned := map[string]bool{}
	for _, pool := range a.o.Assignments {
		assigned[pool] = true
	}
	for _, e := range m.Entries {
		if !assigned[e.Pool] {
			return nil, fmt.Errorf("%w: %s is for pool %s", errUnknownPool, e.Domain, e.Pool)
		}
	}
	// Verification and decoding are CPU-bound and independent per entry: they
	// run on as many workers as the runtime has processors (Go sizes
	// GOMAXPROCS from the agent's cgroup CPU limit). The first error in
	// entry order is the one reported.
	domains := make([]domain.Domain, len(m.Entries))
	errs := make([]error, len(m.Entries))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64 // the next entry to claim
	var wg sync.WaitGroup
	for range max(goruntime.GOMAXPROCS(0), 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(m.Entries) {
					return
				}
				domains[i], errs[i] = a.verifyEntry(ctx, m.Entries[i], fetch)
				if errs[i] != nil {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return runtime.CompilePools(domains)
}

// verifyEntry fetches one artifact, verifies it against its entry and
// decodes it.
func (a *Activator) verifyEntry(ctx context.Context, e manifest.Entry, fetch func(context.Context, string) ([]byte, error)) (domain.Domain, error) {
	data, err := fetch(ctx, e.SHA256)
	if err != nil {
		return domain.Domain{}, fmt.Errorf("fetch artifact of %s: %w", e.Domain, err)
	}
	if err := e.Verify(a.o.PublicKey, a.o.EdgeID, data); err != nil {
		return domain.Domain{}, err
	}
	d, err := domain.Decode(data)
	if err != nil {
		return domain.Domain{}, fmt.Errorf("artifact of %s revision %d: %w", e.Domain, e.Revision, err)
	}
	if d.Domain != e.Domain || d.Pool != e.Pool || d.Revision != e.Revision {
		return domain.Domain{}, fmt.Errorf("%w: artifact says %s/%s revision %d, its entry %s/%s revision %d",
			manifest.ErrInvalid, d.Domain, d.Pool, d.Revision, e.Domain, e.Pool, e.Revision)
	}
	return compact(d), nil
}

// apply installs and switches the changed slots, reloads their cells,
// waits for them to report the sequence, journals the ack, and only then
// records the sequence as active: a crash anywhere before that redoes the
// activation (a no-op on disk) and the ack.
func (a *Activator) apply(ctx context.Context, seq int64, pools map[string]*runtime.PoolRuntime) error {
	var changed []runtime.Slot
	ids := map[string]string{} // slot -> installed release
	// want is the release sequence each reloaded cell must report: seq for
	// changed slots, the active one for unchanged slots whose running cell
	// had not loaded it (an earlier reload that failed, acked as partial).
	want := map[string]int64{}
	for _, s := range a.o.Topology.Slots {
		pool := a.o.Assignments[s.Name]
		if pool == "" {
			continue
		}
		r, err := runtime.BuildRelease(a.o.Render(s, pool, seq), pools[pool])
		if err != nil {
			return err
		}
		if cur, err := runtime.Current(s); err == nil && cur.Digest == r.Meta.Digest && cur.Pool == pool {
			if loaded, running, err := a.o.Cells.Loaded(ctx, s.Name); err == nil && running && loaded != cur.Sequence {
				want[s.Name] = cur.Sequence
			}
			continue
		}
		want[s.Name] = seq
		if _, err := runtime.Install(s, r); err != nil {
			return fmt.Errorf("activate release %d: %w", seq, err)
		}
		ids[s.Name] = r.Meta.ID
		changed = append(changed, s)
	}
	for _, s := range changed {
		if err := runtime.Switch(s, ids[s.Name]); err != nil {
			return fmt.Errorf("activate release %d: %w", seq, err)
		}
		if err := runtime.Prune(s); err != nil {
			a.log.Warn("prune releases", zap.String("cell", s.Name), zap.Error(err))
		}
	}
	for _, s := range a.o.Topology.Slots { // in slot order, not the map's
		if _, ok := want[s.Name]; !ok {
			continue
		}
		if err := a.o.Cells.Reload(s.Name); err != nil {
			a.log.Warn("reload cell", zap.String("cell", s.Name), zap.Error(err))
		}
	}
	missing := a.awaitLoaded(ctx, want)
	ack := manifest.Ack{Sequence: seq, Status: manifest.AckApplied, At: time.Now().UTC()}
	if len(missing) > 0 {
		ack.Status, ack.Cells = manifest.AckPartial, missing
		ack.Reason = fmt.Sprintf("release %d is active but %d cell(s) have not reported loading it", seq, len(missing))
	}
	if err := a.o.Journal.Append(ack); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(a.activePath(), []byte(fmt.Sprintf(`{"sequence":%d}`+"\n", seq)), 0o644); err != nil {
		return fmt.Errorf("record active sequence %d: %w", seq, err)
	}
	a.mu.Lock()
	a.active = seq
	a.mu.Unlock()
	names := make([]string, len(changed))
	for i, s := range changed {
		names[i] = s.Name
	}
	a.log.Info("manifest applied", zap.Int64("sequence", seq), zap.Strings("reloaded", names), zap.String("ack", ack.Status), zap.Strings("not_loaded", missing))
	return nil
}

// awaitLoaded waits until every cell in want reports its sequence, and
// returns the ones that did not within the apply timeout.
func (a *Activator) awaitLoaded(ctx context.Context, want map[string]int64) []string {
	ctx, cancel := context.WithTimeout(ctx, a.o.ApplyTimeout)
	defer cancel()
	waiting := maps.Clone(want)
	delay := 2 * time.Millisecond
	for len(waiting) > 0 {
		for name, seq := range waiting {
			if got, running, err := a.o.Cells.Loaded(ctx, name); err == nil && running && got == seq {
				delete(waiting, name)
			}
		}
		if len(waiting) == 0 {
			break
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			var out []string
			for name := range waiting {
				out = append(out, name)
			}
			sort.Strings(out)
			return out
		case <-t.C:
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
	return nil
}

// refuse journals a refusal ack, once for the same sequence and reason (a
// source keeps serving a bad manifest until it is replaced); the previous
// release stays active.
func (a *Activator) refuse(seq int64, why error) error {
	reason := manifest.Reason(why) // bounded and escaped: it quotes its input
	key := fmt.Sprintf("%d\x00%s", seq, reason)
	a.mu.Lock()
	again := a.refused == key
	a.mu.Unlock()
	if again {
		return nil
	}
	a.log.Error("manifest refused; the previous release stays active", zap.Int64("sequence", seq), zap.String("reason", reason))
	if err := a.o.Journal.Append(manifest.Ack{Sequence: seq, Status: manifest.AckRefused, Reason: reason, At: time.Now().UTC()}); err != nil {
		return err
	}
	a.mu.Lock()
	a.refused = key
	a.mu.Unlock()
	return nil
}

// alreadyRefused tells whether seq was refused (for any reason) last.
func (a *Activator) alreadyRefused(seq int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return seq != 0 && strings.HasPrefix(a.refused, fmt.Sprintf("%d\x00", seq))
}

// Rewind lowers the active sequence to seq (a damaged release was rolled
// back to it at start), so that the next poll applies the newest manifest
// again instead of believing it is already active.
func (a *Activator) Rewind(seq int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seq >= a.active {
		return nil
	}
	if err := atomicfile.WriteFile(a.activePath(), []byte(fmt.Sprintf(`{"sequence":%d}`+"\n", seq)), 0o644); err != nil {
		return err
	}
	a.log.Warn("active sequence rewound after a rollback", zap.Int64("from", a.active), zap.Int64("to", seq))
	a.active = seq
	return nil
}
