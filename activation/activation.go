// Package activation turns an edge's manifest into running configuration.
// One Poll pulls every page after the active sequence, fetches and verifies
// every artifact (size, SHA-256, Ed25519 by the pinned key), decodes and
// compiles the domains into per-pool runtime JSON, installs a complete
// release for every slot whose content changed, switches those slots
// atomically, has only those cells load it (as data where their running
// configuration allows, else by a graceful reload), waits until each reports the new
// sequence, and journals the acknowledgement. Everything is verified before
// anything is written, so a refusal leaves the previous release active and
// untouched and journals a refusal ack instead. agent and agentmetrics
// import it.
package activation

import (
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlclient"
	"cellvisor/internal/atomicfile"
	"cellvisor/internal/clock"
	"cellvisor/manifest"
	"cellvisor/runtime"
)

// Cells is the part of the supervisor activation drives.
type Cells interface {
	// Assign changes a cell's pool ("" unassigns it). A newly assigned
	// cell starts once its release is switched in; an unassigned one is
	// drained and stopped, and Assign returns once it is, or with ctx's
	// error.
	Assign(ctx context.Context, cell, pool string) error
	// Apply makes a cell serve its switched release: loaded as data by a
	// running cell whose configuration allows it, a graceful reload of any
	// other running cell, a start of one that waited for a release. It
	// says how ("loaded", "reloaded: why", "started: why").
	Apply(ctx context.Context, cell string) (how string, err error)
	// Loaded returns the release sequence a running, ready cell reports
	// having loaded (from its private status); running is false otherwise.
	Loaded(ctx context.Context, cell string) (seq int64, running bool, err error)
}

// RuntimeTeller is what Cells may also do: tell the runtime a cell's
// master runs (its version, and whether its binary or a module was
// replaced since), ok false when none runs. Applied and partial acks then
// carry each running cell's (manifest.Ack.Runtimes).
type RuntimeTeller interface {
	RuntimeOf(cell string) (version string, superseded, ok bool)
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
	// Topology and Assignments say which slots serve which pool until a
	// manifest's signed assignments change them. Required.
	Topology    runtime.Topology
	Assignments runtime.Assignments
	// PoolLimits are the limits of the assigned pools, from the last signed
	// assignments, or nil for none.
	PoolLimits map[string]runtime.PoolLimits
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
	// EncryptionKeys reads the keys that open the certificates' keys
	// sealed to this edge (manifest.Entry.Key), read at each activation
	// (a renewal or an enrollment may change them); nil, or none, refuses
	// every entry that carries one.
	EncryptionKeys func() ([]*ecdh.PrivateKey, error)
	// Logger, or nil for none.
	Logger *zap.Logger
	// Clock paces polls and retries and stamps acks, or nil for the real
	// clock.
	Clock clock.Clock
}

// Activator applies manifests.
type Activator struct {
	o     Options
	log   *zap.Logger
	clock clock.Clock

	mu       sync.Mutex // guards the following fields
	active   int64
	refused  string // sequence and reason of the last refusal acknowledged
	lastPoll time.Time
	lastErr  error
	// snapshotRefused stops re-reading a snapshot already refused.
	snapshotRefused bool
	trust           *trust // the pinned key and active revisions: verify_header.go
	// assign and limits are the assignments and pool limits in force.
	assign runtime.Assignments
	limits map[string]runtime.PoolLimits
	// stats are the counters Stats reports; pollStart when the current
	// poll began.
	stats     Stats
	pollStart time.Time

	// opened are the certificate keys the last verified manifest opened,
	// by their seal (openedKey): a manifest that carries the same seals
	// (most of a fleet's entries, manifest after manifest) takes them as
	// they are, rather than opening and checking every one again.
	openedMu sync.Mutex
	opened   map[string][]byte
	// opens counts seals actually opened (tests).
	opens atomic.Int64
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
	if o.PollTimeout == 0 {
		o.PollTimeout = DefaultPollTimeout
	}
	if o.ApplyTimeout == 0 {
		o.ApplyTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	a := &Activator{o: o, log: o.Logger.Named("activation"), clock: clock.Or(o.Clock),
		assign: maps.Clone(o.Assignments), limits: maps.Clone(o.PoolLimits)}
	if a.assign == nil {
		a.assign = runtime.Assignments{}
	}
	if a.limits == nil {
		a.limits = map[string]runtime.PoolLimits{}
	}
	var err error
	if a.trust, err = loadTrust(o.StateDir, o.PublicKey); err != nil {
		return nil, err
	}
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
