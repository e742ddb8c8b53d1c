package controlclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"cellvisor/internal/atomicfile"
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
// Publish writes a manifest so that a reader never sees part of one.
type DirSource struct {
	Dir string
}

var _ manifest.Source = DirSource{}

// newest returns the highest published sequence, or 0.
func (d DirSource) newest() (int64, error) {
	ents, err := os.ReadDir(filepath.Join(d.Dir, "manifests"))
	if err != nil {
		return 0, fmt.Errorf("manifest spool %s: %w", d.Dir, err)
	}
	var newest int64
	for _, e := range ents {
		if seq, err := strconv.ParseInt(e.Name(), 10, 64); err == nil && e.IsDir() && seq > newest {
			newest = seq
		}
	}
	return newest, nil
}

// Page returns a page of the newest manifest after sequence after.
func (d DirSource) Page(_ context.Context, after int64, cursor string) (manifest.Page, error) {
	seq, err := d.newest()
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
	data, err := os.ReadFile(filepath.Join(d.Dir, "manifests", strconv.FormatInt(seq, 10), cursor+".json"))
	if err != nil {
		return manifest.Page{}, err
	}
	return manifest.ParsePage(data) // Collect validates, and refuses naming the sequence
}

// Artifact returns an artifact's bytes.
func (d DirSource) Artifact(_ context.Context, sha256 string) ([]byte, error) {
	if len(sha256) != 64 {
		return nil, fmt.Errorf("%w: artifact name %q", manifest.ErrInvalid, sha256)
	}
	path := filepath.Join(d.Dir, "artifacts", sha256)
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > manifest.MaxArtifactBytes {
		return nil, fmt.Errorf("%w: artifact %s is %d bytes", manifest.ErrSize, sha256, st.Size())
	}
	return os.ReadFile(path)
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

// Snapshot opens snapshot.tar.gz, the spool's full recovery snapshot.
func (d DirSource) Snapshot(context.Context) (io.ReadCloser, error) {
	f, err := os.Open(filepath.Join(d.Dir, "snapshot.tar.gz"))
	if os.IsNotExist(err) {
		return nil, manifest.ErrNoChange
	}
	return f, err
}

// Acks returns the acks recorded, by sequence.
func (d DirSource) Acks() (map[int64]manifest.Ack, error) {
	out := map[int64]manifest.Ack{}
	files, err := filepath.Glob(filepath.Join(d.Dir, "acks", "*.json"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
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
