package manifest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// SnapshotLimit bounds a recovery snapshot, on download and on expansion.
const SnapshotLimit = 96 << 20

// Snapshot is a full recovery snapshot: a manifest and every artifact it
// names, shipped as a gzip'd tar of manifest.json and artifacts/<sha256>.
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

// ReadSnapshot reads a snapshot from r, refusing more than limit bytes
// downloaded or expanded (a gzip bomb), and any entry but manifest.json and
// artifacts/<sha256> regular files: absolute names, "..", links and devices
// are refused, never written anywhere. Artifacts are not verified here; the
// activation verifies each against its signed entry.
//
// A failure to read r (a broken download) is returned as it is, not as a
// refusal: see IsRefusal.
func ReadSnapshot(r io.Reader, limit int64) (Snapshot, error) {
	down := &countingReader{r: r, limit: limit, what: "downloaded"}
	s, err := readSnapshot(down, limit)
	if err != nil && down.srcErr != nil {
		return Snapshot{}, fmt.Errorf("read snapshot: %w", down.srcErr)
	}
	return s, err
}

func readSnapshot(down *countingReader, limit int64) (Snapshot, error) {
	zr, err := gzip.NewReader(down)
	if err != nil {
		return Snapshot{}, fmt.Errorf("%w: %v", ErrSnapshot, err)
	}
	defer zr.Close()
	expanded := &countingReader{r: zr, limit: limit, what: "expanded"}
	tr := tar.NewReader(expanded)
	s := Snapshot{Artifacts: map[string][]byte{}}
	haveManifest := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, ErrTooLarge) {
				return Snapshot{}, err
			}
			return Snapshot{}, fmt.Errorf("%w: %v", ErrSnapshot, err)
		}
		if h.Typeflag == tar.TypeDir && (h.Name == "artifacts/" || h.Name == "artifacts") {
			continue // what `tar czf … manifest.json artifacts` writes
		}
		name, err := snapshotName(h)
		if err != nil {
			return Snapshot{}, err
		}
		// Read into a buffer of the declared size (no doubling growth):
		// the whole snapshot must fit in the agent's memory limit.
		if h.Size < 0 || h.Size > limit-expanded.n {
			return Snapshot{}, fmt.Errorf("%w: entry %s of %d bytes", ErrTooLarge, name, h.Size)
		}
		data := make([]byte, h.Size)
		_, err = io.ReadFull(tr, data)
		if err != nil {
			if errors.Is(err, ErrTooLarge) {
				return Snapshot{}, err
			}
			return Snapshot{}, fmt.Errorf("%w: %s: %v", ErrSnapshot, name, err)
		}
		if name == "manifest.json" {
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&s.Manifest); err != nil {
				return Snapshot{}, fmt.Errorf("%w: manifest.json: %v", ErrSnapshot, err)
			}
			haveManifest = true
			continue
		}
		s.Artifacts[path.Base(name)] = data
	}
	// The whole stream must be within the bound, trailing bytes included.
	if _, err := io.Copy(io.Discard, expanded); err != nil && !errors.Is(err, io.EOF) {
		if errors.Is(err, ErrTooLarge) {
			return Snapshot{}, err
		}
	}
	if !haveManifest {
		return Snapshot{}, fmt.Errorf("%w: no manifest.json", ErrSnapshot)
	}
	seen := map[string]bool{}
	for _, e := range s.Manifest.Entries {
		if err := e.Validate(); err != nil {
			return Snapshot{}, err
		}
		if seen[e.Domain] {
			return Snapshot{}, fmt.Errorf("%w: %s", ErrDuplicate, e.Domain)
		}
		seen[e.Domain] = true
		if _, ok := s.Artifacts[e.SHA256]; !ok {
			return Snapshot{}, fmt.Errorf("%w: no artifact for %s (%s)", ErrSnapshot, e.Domain, e.SHA256)
		}
	}
	return s, nil
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

// WriteSnapshot writes s as a gzip'd tar: the control plane's side, and the tests'.
func WriteSnapshot(w io.Writer, s Snapshot) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	m, err := json.Marshal(s.Manifest)
	if err != nil {
		return err
	}
	write := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := write("manifest.json", m); err != nil {
		return err
	}
	for sum, data := range s.Artifacts {
		if err := write("artifacts/"+sum, data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}
