package manifest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Ack statuses.
const (
	AckApplied = "applied"
	AckRefused = "refused"
	// AckPartial: the release is active but not every affected cell has
	// reported loading it; Cells names those that did not.
	AckPartial = "partial"
)

// Ack tells the control plane what became of one manifest sequence.
type Ack struct {
	Sequence int64     `json:"sequence"`
	Status   string    `json:"status"`
	Reason   string    `json:"reason,omitempty"`
	Cells    []string  `json:"cells,omitempty"`
	At       time.Time `json:"at"`
	// Runtimes are the runtimes the edge's running cells ran when it
	// applied the sequence (applied and partial acks; absent from agents
	// before issue 41), so that the control plane sees which edges still
	// run an old one. See CheckRuntimes.
	Runtimes []CellRuntime `json:"runtimes,omitempty"`
}

// CellRuntime is the runtime one cell's master runs.
type CellRuntime struct {
	Cell string `json:"cell"`
	// Version is what the binary says (nginx -v: "nginx/1.22.1",
	// "openresty/1.25.3.1"); "" when the agent could not tell.
	Version string `json:"version,omitempty"`
	// Superseded says its binary or a module was replaced since it
	// started (a package upgrade it is not rolled onto yet).
	Superseded bool `json:"superseded,omitempty"`
}

// Bounds of an ack's runtimes.
const (
	MaxAckRuntimes    = 32 // an edge has at most 32 cells
	MaxRuntimeVersion = 64
)

// CheckRuntimes checks an ack's runtimes: at most MaxAckRuntimes, each a
// cell named once, with a version of at most MaxRuntimeVersion characters
// among letters, digits and " ._+~:/()-".
func CheckRuntimes(rs []CellRuntime) error {
	if len(rs) > MaxAckRuntimes {
		return fmt.Errorf("%w: runtimes: %d cells, at most %d", ErrInvalid, len(rs), MaxAckRuntimes)
	}
	seen := map[string]bool{}
	for _, r := range rs {
		if seen[r.Cell] {
			return fmt.Errorf("%w: runtimes: cell %q twice", ErrInvalid, r.Cell)
		}
		seen[r.Cell] = true
		if len(r.Version) > MaxRuntimeVersion || strings.IndexFunc(r.Version, badVersionRune) >= 0 {
			return fmt.Errorf("%w: runtimes: %q: version %q: want at most %d characters among letters, digits and \" ._+~:/()-\"",
				ErrInvalid, r.Cell, r.Version, MaxRuntimeVersion)
		}
	}
	return nil
}

func badVersionRune(r rune) bool {
	return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune(" ._+~:/()-", r))
}

// ErrNoChange is returned by a Source when there is no manifest after the
// active sequence.
var ErrNoChange = errors.New("no manifest after the active sequence")

// ErrSnapshotBusy is returned by a Source's Snapshot when it will not serve
// the snapshot now (the control API serves as many as it may, or this
// edge's or its org's share of them): the edge pages the manifest instead.
var ErrSnapshotBusy = errors.New("recovery snapshot not served now")

// Source is where an edge gets its manifests and artifacts and sends its
// acknowledgements: the control API (controlclient) or a directory.
type Source interface {
	// Page returns the page at cursor of the newest manifest after
	// sequence after, or ErrNoChange.
	Page(ctx context.Context, after int64, cursor string) (Page, error)
	// Artifact returns the bytes of the artifact with this SHA-256.
	Artifact(ctx context.Context, sha256 string) ([]byte, error)
	// Ack delivers an acknowledgement; the source de-duplicates by sequence.
	Ack(ctx context.Context, a Ack) error
	// Snapshot opens the full recovery snapshot (gzip'd tar, see
	// ReadSnapshot), or returns ErrNoChange when there is none, or an
	// error wrapping ErrSnapshotBusy when it is not served now.
	Snapshot(ctx context.Context) (io.ReadCloser, error)
}
