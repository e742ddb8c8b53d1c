package manifest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"cellvisor/internal/safefile"
)

// Snapshot bounds.
const (
	// SnapshotLimit bounds a recovery snapshot, on download and on
	// expansion.
	SnapshotLimit = 96 << 20
	// MaxSnapshotManifestBytes bounds a snapshot's manifest.json, which is
	// decoded in memory (about 20,000 entries); the control API serves no
	// snapshot with a bigger one, and the edge pages the manifest instead.
	MaxSnapshotManifestBytes = 8 << 20
)

// Snapshot is a full recovery snapshot held in memory, for writing one
// (WriteSnapshot): a manifest and every artifact it names, shipped as a
// gzip'd tar of manifest.json, first, then artifacts/<sha256>.
type Snapshot struct {
	Manifest  Manifest
	Artifacts map[string][]byte // by sha256
}

// countingReader fails once more than limit bytes were read through it.
type countingReader struct {
	r     io.Reader
	n     int64
	limit int64
	what  string
	// srcErr is the first error of r but EOF: the download failed, which
	// says nothing of the snapshot.
	srcErr error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF && c.srcErr == nil {
		c.srcErr = err
	}
	c.n += int64(n)
	if c.n > c.limit {
		return n, fmt.Errorf("%w: more than %d bytes %s", ErrTooLarge, c.limit, c.what)
	}
	return n, err
}

// StagedSnapshot is a recovery snapshot read into a staging directory: its
// manifest, decoded and validated, and every artifact it names, on disk,
// checked for size and SHA-256 against the entries naming it. Signatures
// are not checked here: the activation verifies every artifact it reads
// back with Artifact against its signed entry, as for fetched ones.
type StagedSnapshot struct {
	Manifest Manifest
	dir      string
	sizes    map[string]int64 // by sha256
}

// ReadSnapshot reads a snapshot from r as a stream into a new directory
// under parent, in memory bounded by one copy buffer and manifest.json,
// never by a size an archive header declares:
//
//   - at most limit bytes downloaded and limit expanded (a gzip bomb);
//   - manifest.json first, at most MaxSnapshotManifestBytes, strictly
//     decoded, every entry valid and no domain twice;
//   - then only artifacts/<sha256> regular files, each named by an entry,
//     of the size that entry says, whose bytes hash to its name, and none
//     twice; absolute names, "..", links and devices are refused and never
//     written anywhere;
//   - every entry's artifact present.
//
// Reads stop when ctx ends. A failure to read r (a broken download) or to
// write the staging directory is returned as it is, not as a refusal: see
// IsRefusal. The caller closes the snapshot, which removes its directory.
func ReadSnapshot(ctx context.Context, r io.Reader, limit int64, parent string) (*StagedSnapshot, error) {
	dir, err := os.MkdirTemp(parent, ".snapshot-")
	if err != nil {
		return nil, fmt.Errorf("stage snapshot: %w", err)
	}
	s := &StagedSnapshot{dir: dir, sizes: map[string]int64{}}
	down := &countingReader{r: safefile.Reader(ctx, r), limit: limit, what: "downloaded"}
	err = s.read(down, limit)
	if err != nil && down.srcErr != nil {
		err = fmt.Errorf("read snapshot: %w", down.srcErr)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *StagedSnapshot) read(down *countingReader, limit int64) error {
	zr, err := gzip.NewReader(down)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrSnapshot, err)
	}
	defer zr.Close()
	expanded := &countingReader{r: zr, limit: limit, what: "expanded"}
	tr := tar.NewReader(expanded)
	haveManifest := false
	want := map[string]int64{} // artifacts the entries name, by sha256
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return snapshotErr("", err)
		}
		if h.Typeflag == tar.TypeDir && (h.Name == "artifacts/" || h.Name == "artifacts") {
			continue // what `tar czf … manifest.json artifacts` writes
		}
		name, err := snapshotName(h)
		if err != nil {
			return err
		}
		if h.Size < 0 || h.Size > limit-expanded.n {
			return fmt.Errorf("%w: entry %q of %d bytes", ErrTooLarge, name, h.Size)
		}
		if name == "manifest.json" {
			if haveManifest {
				return fmt.Errorf("%w: manifest.json twice", ErrSnapshot)
			}
			if want, err = s.readManifest(tr, h.Size); err != nil {
				return err
			}
			haveManifest = true
			continue
		}
		if !haveManifest {
			return fmt.Errorf("%w: %q before manifest.json, which must come first", ErrSnapshot, name)
		}
		sum := strings.TrimPrefix(name, "artifacts/")
		size, named := want[sum]
		switch {
		case !named:
			return fmt.Errorf("%w: %q is named by no entry of the manifest", ErrSnapshot, name)
		case s.sizes[sum] != 0:
			return fmt.Errorf("%w: %q twice", ErrSnapshot, name)
		case h.Size != size:
			return fmt.Errorf("%w: snapshot %s is %d bytes, its entry says %d", ErrSize, name, h.Size, size)
		}
		if err := s.stage(tr, sum, size); err != nil {
			return err
		}
	}
	// The whole stream must be within the bound, trailing bytes included.
	// and the gzip checksum checked at its end.
	if _, err := io.Copy(io.Discard, expanded); err != nil {
		return snapshotErr("", err)
	}
	if !haveManifest {
		return fmt.Errorf("%w: no manifest.json", ErrSnapshot)
	}
	for _, e := range s.Manifest.Entries {
		if s.sizes[e.SHA256] == 0 {
			return fmt.Errorf("%w: no artifact for %s (%s)", ErrSnapshot, e.Domain, e.SHA256)
		}
	}
	return nil
}

// snapshotErr makes an error of the archive a refusal, keeping a bound's.
func snapshotErr(name string, err error) error {
	if errors.Is(err, ErrTooLarge) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if name != "" {
		return fmt.Errorf("%w: %s: %v", ErrSnapshot, name, err)
	}
	return fmt.Errorf("%w: %v", ErrSnapshot, err)
}

// readManifest decodes manifest.json, the one place a snapshot's manifest
// is decoded (the whole Manifest, strictly), and validates its entries. It
// returns the size of each artifact the entries name.
func (s *StagedSnapshot) readManifest(r io.Reader, size int64) (map[string]int64, error) {
	if size > MaxSnapshotManifestBytes {
		return nil, fmt.Errorf("%w: manifest.json of %d bytes, at most %d", ErrTooLarge, size, MaxSnapshotManifestBytes)
	}
	var buf bytes.Buffer
	buf.Grow(int(size)) // bounded just above
	if _, err := io.CopyN(&buf, r, size); err != nil {
		return nil, snapshotErr("manifest.json", err)
	}
	dec := json.NewDecoder(&buf)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s.Manifest); err != nil {
		return nil, fmt.Errorf("%w: manifest.json: %v", ErrSnapshot, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: manifest.json: trailing data", ErrSnapshot)
	}
	want := map[string]int64{}
	seen := map[string]bool{}
	for _, e := range s.Manifest.Entries {
		if err := e.Validate(); err != nil {
			return nil, err
		}
		if seen[e.Domain] {
			return nil, fmt.Errorf("%w: %s", ErrDuplicate, e.Domain)
		}
		seen[e.Domain] = true
		if n, ok := want[e.SHA256]; ok && n != e.Size {
			return nil, fmt.Errorf("%w: entries disagree on the size of %s", ErrSize, e.SHA256)
		}
		want[e.SHA256] = e.Size
	}
	return want, nil
}

// stage writes one artifact of size bytes (at most MaxArtifactBytes, its
// entry's) into the staging directory, hashing it as it goes.
func (s *StagedSnapshot) stage(r io.Reader, sum string, size int64) error {
	f, err := os.OpenFile(filepath.Join(s.dir, sum), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("stage snapshot: %w", err)
	}
	h := sha256.New()
	_, err = io.CopyN(io.MultiWriter(f, h), r, size)
	if cerr := f.Close(); err == nil && cerr != nil {
		return fmt.Errorf("stage snapshot: %w", cerr)
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("stage snapshot: %w", err) // the disk, not the snapshot
	}
	if err != nil {
		return snapshotErr("artifacts/"+sum, err)
	}
	if hex.EncodeToString(h.Sum(nil)) != sum {
		return fmt.Errorf("%w: snapshot artifacts/%s: its bytes hash otherwise", ErrDigest, sum)
	}
	s.sizes[sum] = size
	return nil
}

// Artifact reads a staged artifact back: a regular file of the size its
// entry says, read with the bounds of package safefile.
func (s *StagedSnapshot) Artifact(ctx context.Context, sum string) ([]byte, error) {
	size, ok := s.sizes[sum]
	if !ok {
		return nil, fmt.Errorf("%w: no artifact %s in the snapshot", ErrSnapshot, sum)
	}
	data, err := safefile.ReadFile(ctx, filepath.Join(s.dir, sum), size)
	if err != nil {
		return nil, fmt.Errorf("staged snapshot: %w", err)
	}
	return data, nil
}

// Close removes the staging directory.
func (s *StagedSnapshot) Close() error {
	if s == nil || s.dir == "" {
		return nil
	}
	return os.RemoveAll(s.dir)
}

// snapshotName accepts only the two shapes of name a snapshot holds.
func snapshotName(h *tar.Header) (string, error) {
	name := h.Name
	switch {
	case h.Typeflag != tar.TypeReg:
		return "", fmt.Errorf("%w: %q is not a regular file (type %c): links and devices are refused", ErrSnapshot, name, h.Typeflag)
	case strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("%w: %q is an absolute name", ErrSnapshot, name)
	case strings.Contains(name, ".."):
		return "", fmt.Errorf("%w: %q escapes the snapshot", ErrSnapshot, name)
	case name == "manifest.json":
		return name, nil
	case strings.HasPrefix(name, "artifacts/") && isSHA256(strings.TrimPrefix(name, "artifacts/")):
		return name, nil
	}
	return "", fmt.Errorf("%w: unexpected entry %q", ErrSnapshot, name)
}

// SnapshotWriter writes a snapshot as a stream, one artifact at a time:
// the control plane's side.
type SnapshotWriter struct {
	zw *gzip.Writer
	tw *tar.Writer
}

// NewSnapshotWriter starts a snapshot of m on w, manifest.json first.
func NewSnapshotWriter(w io.Writer, m Manifest) (*SnapshotWriter, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	// BestSpeed: a snapshot is built on the control plane for every
	// recovering edge; artifacts are signed JSON, and the fastest level
	// costs a fraction of the default's CPU for a few percent more bytes.
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	sw := &SnapshotWriter{zw: zw, tw: tar.NewWriter(zw)}
	return sw, sw.write("manifest.json", data)
}

// Artifact adds an artifact's bytes.
func (sw *SnapshotWriter) Artifact(sum string, data []byte) error {
	return sw.write("artifacts/"+sum, data)
}

func (sw *SnapshotWriter) write(name string, data []byte) error {
	if err := sw.tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := sw.tw.Write(data)
	return err
}

// Close ends the archive and the gzip stream (not the writer under them).
func (sw *SnapshotWriter) Close() error {
	if err := sw.tw.Close(); err != nil {
		return err
	}
	return sw.zw.Close()
}

// WriteSnapshot writes s as a gzip'd tar, the tests' side.
func WriteSnapshot(w io.Writer, s Snapshot) error {
	sw, err := NewSnapshotWriter(w, s.Manifest)
	if err != nil {
		return err
	}
	for sum, data := range s.Artifacts {
		if err := sw.Artifact(sum, data); err != nil {
			return err
		}
	}
	return sw.Close()
}
