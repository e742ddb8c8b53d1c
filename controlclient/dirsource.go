package controlclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"cellvisor/internal/atomicfile"
	"cellvisor/internal/safefile"
	"cellvisor/manifest"
)

// DirSource is a manifest.Source on a directory, for edges fed by file
// transfer (air-gapped sites) and for tests:
//
//	manifests/<sequence>/<cursor>.json   pages; the first page's cursor is "0"
//	artifacts/<sha256>                   artifact bytes
//	acks/<sequence>.json                 acks the edge wrote (one per sequence)
//	snapshot.tar.gz                      a full recovery snapshot, optional
//
// Everything it reads is read with its bound checked first (package
// safefile): regular files only, never through a symbolic link, never a
// FIFO or device; a page at most manifest.MaxPageBytes, an artifact
// manifest.MaxArtifactBytes, the snapshot manifest.SnapshotLimit; and reads
// stop when the poll's context ends. What breaks a rule is refused as a
// manifest refusal naming the file.
//
// Publish writes a manifest so that a reader never sees part of one.
type DirSource struct {
	Dir string
}

var _ manifest.Source = DirSource{}

// newest returns the highest published sequence above after that this
// edge has not refused, or 0. manifests/ is opened as a directory only
// (O_DIRECTORY|O_NONBLOCK: a FIFO in its place fails at once instead of
// waiting for a writer) and read in batches. A sequence whose ack in acks/
// says refused is skipped: a bogus directory with a high sequence would
// otherwise be the newest at every poll, refused every time, and hide every
// good manifest published after it (below its number), even across agent
// restarts. To publish a fixed manifest, use a new sequence.
func (d DirSource) newest(ctx context.Context, after int64) (int64, error) {
	f, err := os.OpenFile(filepath.Join(d.Dir, "manifests"), os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("manifest spool %s: %w", d.Dir, err)
	}
	defer f.Close()
	var seqs []int64
	for ctx.Err() == nil {
		ents, err := f.ReadDir(1024)
		for _, e := range ents {
			if seq, err := strconv.ParseInt(e.Name(), 10, 64); err == nil && e.IsDir() && seq > after {
				seqs = append(seqs, seq)
			}
		}
		if err == io.EOF {
			slices.Sort(seqs)
			for i := len(seqs) - 1; i >= 0; i-- {
				if !d.refused(ctx, seqs[i]) {
					return seqs[i], nil
				}
			}
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("manifest spool %s: %w", d.Dir, err)
		}
	}
	return 0, ctx.Err()
}

// refused reports whether this edge's ack of seq says refused.
func (d DirSource) refused(ctx context.Context, seq int64) bool {
	data, err := safefile.ReadFile(ctx, filepath.Join(d.Dir, "acks", strconv.FormatInt(seq, 10)+".json"), 64<<10)
	if err != nil {
		return false
	}
	var a manifest.Ack
	return json.Unmarshal(data, &a) == nil && a.Sequence == seq && a.Status == manifest.AckRefused
}

// Page returns a page of the newest manifest after sequence after. The
// page file is read with the bounds of refuse: a symbolic link, FIFO,
// device, or a file over manifest.MaxPageBytes is refused unread.
func (d DirSource) Page(ctx context.Context, after int64, cursor string) (manifest.Page, error) {
	seq, err := d.newest(ctx, after)
	if err != nil {
		return manifest.Page{}, err
	}
	if seq <= after {
		return manifest.Page{}, manifest.ErrNoChange
	}
	if cursor == "" {
		cursor = "0"
	}
	if _, err := strconv.Atoi(cursor); err != nil {
		return manifest.Page{}, fmt.Errorf("%w: cursor %q", manifest.ErrInvalid, cursor)
	}
	name := filepath.Join("manifests", strconv.FormatInt(seq, 10), cursor+".json")
	data, err := safefile.ReadFile(ctx, filepath.Join(d.Dir, name), manifest.MaxPageBytes)
	var p manifest.Page
	if err != nil {
		err = refuse(manifest.ErrInvalid, name, manifest.MaxPageBytes, err)
	} else if p, err = manifest.ParsePage(data); err == nil && p.Sequence != seq {
		// The directory's number is what the spool is ordered by and what
		// a refusal is remembered by: a page must carry it.
		err = fmt.Errorf("%w: spool %s holds a page of sequence %d", manifest.ErrInvalid, name, p.Sequence)
	}
	if manifest.IsRefusal(err) {
		// A page that cannot be read or parsed is acked refused with
		// sequence 0 by the agent (it does not know the sequence): the
		// spool records the directory's refusal itself, so that newest
		// skips it from now on.
		_ = d.Ack(ctx, manifest.Ack{Sequence: seq, Status: manifest.AckRefused, Reason: manifest.Reason(err), At: time.Now().UTC()})
	}
	if err != nil {
		return manifest.Page{}, err
	}
	return p, nil // Collect validates, and refuses naming the sequence
}

// refuse makes a spool file's refusal (not a regular file, over its bound
// of max bytes) a refusal of the manifest, of kind, naming the file by its
// name in the spool; any other error (missing, unreadable) is returned as
// it is, to be retried.
func refuse(kind error, name string, max int64, err error) error {
	switch {
	case errors.Is(err, safefile.ErrTooLarge):
		return fmt.Errorf("%w: spool %s is over %d bytes", kind, name, max)
	case errors.Is(err, safefile.ErrNotRegular):
		return fmt.Errorf("%w: spool %s is not a regular file (links, FIFOs and devices are refused)", kind, name)
	}
	return err
}

// Artifact returns an artifact's bytes, read with the bounds of Page: at
// most manifest.MaxArtifactBytes of a regular file.
func (d DirSource) Artifact(ctx context.Context, sha256 string) ([]byte, error) {
	if len(sha256) != 64 || strings.ContainsAny(sha256, "/.") {
		return nil, fmt.Errorf("%w: artifact name %q", manifest.ErrInvalid, sha256)
	}
	name := filepath.Join("artifacts", sha256)
	data, err := safefile.ReadFile(ctx, filepath.Join(d.Dir, name), manifest.MaxArtifactBytes)
	if errors.Is(err, safefile.ErrTooLarge) {
		return nil, refuse(manifest.ErrSize, name, manifest.MaxArtifactBytes, err)
	}
	if err != nil {
		return nil, refuse(manifest.ErrInvalid, name, manifest.MaxArtifactBytes, err)
	}
	return data, nil
}

// Ack records an ack, replacing an earlier one for the same sequence.
func (d DirSource) Ack(_ context.Context, a manifest.Ack) error {
	dir := filepath.Join(d.Dir, "acks")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, strconv.FormatInt(a.Sequence, 10)+".json"), data, 0o644)
}

// Snapshot opens snapshot.tar.gz, the spool's full recovery snapshot: a
// regular file of at most manifest.SnapshotLimit bytes, whose reads stop
// when ctx ends.
func (d DirSource) Snapshot(ctx context.Context) (io.ReadCloser, error) {
	f, _, err := safefile.Open(filepath.Join(d.Dir, "snapshot.tar.gz"), manifest.SnapshotLimit)
	switch {
	case os.IsNotExist(err):
		return nil, manifest.ErrNoChange
	case errors.Is(err, safefile.ErrTooLarge):
		return nil, refuse(manifest.ErrTooLarge, "snapshot.tar.gz", manifest.SnapshotLimit, err)
	case err != nil:
		return nil, refuse(manifest.ErrSnapshot, "snapshot.tar.gz", manifest.SnapshotLimit, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{safefile.Reader(ctx, f), f}, nil
}

// Acks returns the acks recorded, by sequence.
func (d DirSource) Acks() (map[int64]manifest.Ack, error) {
	out := map[int64]manifest.Ack{}
	files, err := filepath.Glob(filepath.Join(d.Dir, "acks", "*.json"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		data, err := safefile.ReadFile(context.Background(), f, MaxJournalLine)
		if err != nil {
			return nil, err
		}
		var a manifest.Ack
		if err := json.Unmarshal(data, &a); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out[a.Sequence] = a
	}
	return out, nil
}

// Publish writes artifacts, then the manifest's pages into a staging
// directory renamed into place: the control plane's side of the spool. The
// manifest must be signed already (manifest.Sign, with the control plane's
// key, which never comes near an edge): Publish refuses one without a
// header, or whose header does not match its edge, sequence and entries,
// so that tooling cannot write a spool every edge would refuse.
func (d DirSource) Publish(m manifest.Manifest, artifacts map[string][]byte) error {
	h := m.Header
	switch {
	case m.HeaderSignature == "":
		return fmt.Errorf("publish %d: %w: the manifest is not signed (manifest.Sign)", m.Sequence, manifest.ErrHeader)
	case m.Sequence < 1 || m.Sequence > manifest.MaxSequence:
		return fmt.Errorf("publish %d: %w: sequence is not 1–%d", m.Sequence, manifest.ErrInvalid, int64(manifest.MaxSequence))
	case h.EdgeID != m.EdgeID || h.Sequence != m.Sequence || h.Entries != len(m.Entries) ||
		h.EntriesDigest != manifest.EntriesDigest(m.EdgeID, m.Entries):
		return fmt.Errorf("publish %d: %w: the signed header does not match the manifest", m.Sequence, manifest.ErrHeader)
	}
	for _, sub := range []string{"manifests", "artifacts"} {
		if err := os.MkdirAll(filepath.Join(d.Dir, sub), 0o755); err != nil {
			return err
		}
	}
	for sum, data := range artifacts {
		path := filepath.Join(d.Dir, "artifacts", sum)
		if _, err := os.Stat(path); err == nil {
			continue // content-addressed: already there
		}
		if err := atomicfile.WriteFile(path, data, 0o644); err != nil {
			return err
		}
	}
	stage, err := os.MkdirTemp(filepath.Join(d.Dir, "manifests"), ".stage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	for i, p := range manifest.Paginate(m, manifest.MaxEntries) {
		data, err := json.Marshal(p)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(stage, strconv.Itoa(i)+".json"), data, 0o644); err != nil {
			return err
		}
	}
	if err := os.Chmod(stage, 0o755); err != nil {
		return err
	}
	return os.Rename(stage, filepath.Join(d.Dir, "manifests", strconv.FormatInt(m.Sequence, 10)))
}
