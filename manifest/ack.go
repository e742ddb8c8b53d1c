package manifest

import (
	"context"
	"errors"
	"io"
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
