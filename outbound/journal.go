package outbound

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"go.uber.org/zap"

	"cellvisor/edgeapi"
	"cellvisor/internal/atomicfile"
	"cellvisor/internal/safefile"
)

// ErrJournalFull is a bundle refused at the journal's bound.
var ErrJournalFull = errors.New("bundle journal full")

// isBundleID reports whether s is a bundle id: 128 bits in lowercase hex.
func isBundleID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Journal keeps bundles on disk, one file per bundle (<id>.json, written
// atomically and fsynced), from before their first send until they are
// delivered, so that an agent restart loses none. It is bounded in count
// and bytes: at the bound a new bundle is refused (ErrJournalFull) and
// counted, and the bundles already journaled stay. The oldest are kept
// because each of them was promised delivery already; a refused producer
// bundle is logged and counted in status, a refused forward is answered
// 507 and its sender delivers it itself.
type Journal struct {
	dir      string
	maxCount int
	maxBytes int64
	log      *zap.Logger

	mu      sync.Mutex // guards the following fields
	entries map[string]entry
	bytes   int64
	refused int64
	damaged int
	lastErr string
}

type entry struct {
	b    edgeapi.Bundle
	size int64
}

// OpenJournal opens (creating) the journal in dir and loads its bundles:
// each file read with safefile's rules (regular, no link, no FIFO, at most
// edgeapi.MaxBundleBytes); a file that is refused or does not decode into a
// valid bundle is renamed *.bad, logged and counted, never deleted.
func OpenJournal(ctx context.Context, dir string, maxCount int, maxBytes int64, log *zap.Logger) (*Journal, error) {
	if maxCount < 1 || maxBytes < edgeapi.MaxBundleBytes {
		return nil, fmt.Errorf("bundle journal: bounds %d bundles, %d bytes: want at least 1 and %d", maxCount, maxBytes, edgeapi.MaxBundleBytes)
	}
	if log == nil {
		log = zap.NewNop()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bundle journal: %w", err)
	}
	j := &Journal{dir: dir, maxCount: maxCount, maxBytes: maxBytes, log: log, entries: map[string]entry{}}
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("bundle journal: %w", err)
	}
	for _, d := range names {
		name := d.Name()
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue // temporaries of an interrupted write, set-aside files
		}
		b, size, err := readBundle(ctx, filepath.Join(dir, name))
		if err == nil && name != b.ID+".json" {
			err = fmt.Errorf("names bundle %s", b.ID)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			j.damaged++
			log.Error("bundle journal: unreadable file set aside", zap.String("file", name), zap.Error(err))
			os.Rename(filepath.Join(dir, name), filepath.Join(dir, name+".bad"))
			continue
		}
		j.entries[b.ID] = entry{b, size}
		j.bytes += size
	}
	return j, nil
}

func readBundle(ctx context.Context, path string) (edgeapi.Bundle, int64, error) {
	data, err := safefile.ReadFile(ctx, path, edgeapi.MaxBundleBytes)
	if err != nil {
		return edgeapi.Bundle{}, 0, err
	}
	var b edgeapi.Bundle
	if err := json.Unmarshal(data, &b); err != nil {
		return edgeapi.Bundle{}, 0, err
	}
	if err := Validate(b); err != nil {
		return edgeapi.Bundle{}, 0, err
	}
	return b, int64(len(data)), nil
}

// Put journals b durably. A bundle already journaled is taken again
// without a write (a forward sent twice); ErrJournalFull at the bound.
func (j *Journal) Put(b edgeapi.Bundle) error {
	if err := Validate(b); err != nil {
		return err
	}
	data, err := json.Marshal(b)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.entries[b.ID]; ok {
		return nil
	}
	size := int64(len(data))
	if len(j.entries) >= j.maxCount || j.bytes+size > j.maxBytes {
		j.refused++
		j.lastErr = fmt.Sprintf("refused bundle %s (%s): %d bundles, %d bytes journaled, bounds %d and %d", b.ID, b.Class, len(j.entries), j.bytes, j.maxCount, j.maxBytes)
		return fmt.Errorf("%w: %s", ErrJournalFull, j.lastErr)
	}
	// Written under the lock: the bound holds for concurrent puts, and a
	// bundle is a small file.
	if err := atomicfile.WriteFile(j.path(b.ID), data, 0o600); err != nil {
		j.lastErr = err.Error()
		return fmt.Errorf("journal bundle %s: %w", b.ID, err)
	}
	j.entries[b.ID] = entry{b, size}
	j.bytes += size
	return nil
}

// Remove forgets a delivered bundle.
func (j *Journal) Remove(id string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.entries[id]
	if !ok {
		return nil
	}
	if err := os.Remove(j.path(id)); err != nil && !os.IsNotExist(err) {
		j.lastErr = err.Error()
		return fmt.Errorf("remove delivered bundle %s: %w", id, err)
	}
	delete(j.entries, id)
	j.bytes -= e.size
	return nil
}

// Pending lists a class's journaled bundles, oldest first.
func (j *Journal) Pending(class string) []edgeapi.Bundle {
	j.mu.Lock()
	var out []edgeapi.Bundle
	for _, e := range j.entries {
		if e.b.Class == class {
			out = append(out, e.b)
		}
	}
	j.mu.Unlock()
	sort.Slice(out, func(a, b int) bool {
		if !out[a].CreatedAt.Equal(out[b].CreatedAt) {
			return out[a].CreatedAt.Before(out[b].CreatedAt)
		}
		return out[a].ID < out[b].ID
	})
	return out
}

// Status reports the journal.
func (j *Journal) Status() edgeapi.JournalStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	return edgeapi.JournalStatus{Bundles: len(j.entries), Bytes: j.bytes, MaxBundles: j.maxCount, MaxBytes: j.maxBytes,
		Refused: j.refused, Damaged: j.damaged, LastError: j.lastErr}
}

func (j *Journal) path(id string) string { return filepath.Join(j.dir, id+".json") }
