package controlapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/store"
	"cellvisor/manifest"
)

// DefaultSnapshotDownloads is how many recovery snapshots one replica
// serves at a time when Options.SnapshotDownloads is zero.
const DefaultSnapshotDownloads = 16

// snapshotRetryAfter is what a refused download is told to wait, in
// seconds.
const snapshotRetryAfter = "10"

// snapshots builds each edge's recovery snapshot once per sequence into a
// file, and serves every download of it from that file: a download costs
// the copy buffers of one connection, not the snapshot. The files are
// unlinked as soon as they are created, so that nothing is left on disk
// after a crash or a restart, and closed (their space freed) once replaced
// by a newer sequence's or evicted and no download reads them. At most
// cap(slots) downloads and builds run at a time; beyond, the edge is told
// to come back later (503 with Retry-After), which it does as for any
// failed poll.
type snapshots struct {
	dir   string
	slots chan struct{}
	log   *zap.Logger

	mu    sync.Mutex // guards the following fields
	files map[string]*snapshotFile
	clock uint64 // counts uses, for eviction
}

// snapshotFile is one edge's snapshot at one sequence.
type snapshotFile struct {
	edge  string
	seq   int64
	ready chan struct{} // closed once built (or failed)

	// Set before ready is closed, then read-only.
	f    *os.File
	size int64
	at   time.Time
	err  error

	refs    int    // downloads reading f; guarded by snapshots.mu
	evicted bool   // no longer in files; guarded by snapshots.mu
	used    uint64 // snapshots.clock at its last use; guarded by snapshots.mu
}

func newSnapshots(dir string, downloads int, log *zap.Logger) *snapshots {
	return &snapshots{dir: dir, slots: make(chan struct{}, downloads), log: log, files: map[string]*snapshotFile{}}
}

// maxFiles bounds the snapshots kept between downloads (each one up to
// manifest.SnapshotLimit of disk).
func (ss *snapshots) maxFiles() int { return 2 * cap(ss.slots) }

// acquire returns the edge's snapshot at seq, or a newer one, building it
// if no download has yet; the caller releases it.
func (ss *snapshots) acquire(ctx context.Context, edge string, seq int64, build func(*os.File) (int64, error)) (*snapshotFile, error) {
	ss.mu.Lock()
	sf := ss.files[edge]
	if sf == nil || sf.seq < seq || sf.failed() {
		if sf != nil {
			ss.evictLocked(sf)
		}
		sf = &snapshotFile{edge: edge, seq: seq, ready: make(chan struct{})}
		ss.files[edge] = sf
		go ss.build(sf, build)
	}
	sf.refs++
	ss.clock++
	sf.used = ss.clock
	ss.trimLocked()
	ss.mu.Unlock()
	select {
	case <-sf.ready:
	case <-ctx.Done():
		ss.release(sf)
		return nil, ctx.Err()
	}
	if sf.err != nil {
		ss.release(sf)
		return nil, sf.err
	}
	return sf, nil
}

// failed reports a build that failed; the caller holds ss.mu.
func (sf *snapshotFile) failed() bool {
	select {
	case <-sf.ready:
		return sf.err != nil
	default:
		return false
	}
}

// build writes the snapshot into an unlinked file. It runs on its own, so
// that a download that gives up does not waste a build others wait for;
// the download slot of the request that started it bounds how many run.
func (ss *snapshots) build(sf *snapshotFile, build func(*os.File) (int64, error)) {
	defer close(sf.ready)
	f, err := os.CreateTemp(ss.dir, ".snapshot-")
	if err != nil {
		sf.err = fmt.Errorf("snapshot file: %w", err)
		return
	}
	os.Remove(f.Name()) // lives as long as it is open
	size, err := build(f)
	if err != nil {
		f.Close()
		sf.err = err
		return
	}
	sf.f, sf.size, sf.at = f, size, time.Now()
	ss.log.Info("recovery snapshot built", zap.String("edge", sf.edge), zap.Int64("sequence", sf.seq), zap.Int64("bytes", size))
}

// release ends a download of sf.
func (ss *snapshots) release(sf *snapshotFile) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sf.refs--
	ss.closeIfDoneLocked(sf)
}

// evictLocked forgets sf; its file closes when its last download ends.
func (ss *snapshots) evictLocked(sf *snapshotFile) {
	if ss.files[sf.edge] == sf {
		delete(ss.files, sf.edge)
	}
	sf.evicted = true
	ss.closeIfDoneLocked(sf)
}

func (ss *snapshots) closeIfDoneLocked(sf *snapshotFile) {
	if !sf.evicted || sf.refs > 0 {
		return
	}
	go func() { // after the build, which may still run
		<-sf.ready
		if sf.f != nil {
			sf.f.Close()
		}
	}()
}

// trimLocked evicts the least recently used idle snapshots over maxFiles.
func (ss *snapshots) trimLocked() {
	for len(ss.files) > ss.maxFiles() {
		var lru *snapshotFile
		for _, sf := range ss.files {
			if sf.refs == 0 && (lru == nil || sf.used < lru.used) {
				lru = sf
			}
		}
		if lru == nil {
			return // all in use: the download slots bound them
		}
		ss.evictLocked(lru)
	}
}

// close closes every file (at shutdown, once no download runs).
func (ss *snapshots) close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, sf := range ss.files {
		ss.evictLocked(sf)
	}
}

// snapshot serves the edge's current manifest and every artifact it names
// as a gzip'd tar (manifest.ReadSnapshot's format), built once per
// sequence and served from a file; 503 with Retry-After while the replica
// serves as many as it may.
func (s *Server) snapshot(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	if st.Sequence == 0 {
		return errorf(http.StatusNotFound, "edge %s has no manifest yet", st.ID)
	}
	select {
	case s.snaps.slots <- struct{}{}:
		defer func() { <-s.snaps.slots }()
	default:
		w.Header().Set("Retry-After", snapshotRetryAfter)
		return errorf(http.StatusServiceUnavailable, "%d recovery snapshots are being served; retry later", cap(s.snaps.slots))
	}
	sf, err := s.snaps.acquire(r.Context(), st.ID, st.Sequence, func(f *os.File) (int64, error) {
		return s.buildSnapshot(context.WithoutCancel(r.Context()), f, st.ID, st.Sequence)
	})
	if errors.Is(err, store.ErrNotFound) {
		// The sequence was superseded while it was built.
		w.Header().Set("Retry-After", "1")
		return errorf(http.StatusServiceUnavailable, "edge %s's manifest moved on while its snapshot was built; retry", st.ID)
	}
	if err != nil {
		return err
	}
	defer s.snaps.release(sf)
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("ETag", etag(sf.seq))
	http.ServeContent(w, r, "", sf.at, io.NewSectionReader(sf.f, 0, sf.size))
	return nil
}

// errSnapshotTooBig answers a snapshot over its bounds: the edge pages the
// manifest instead.
var errSnapshotTooBig = errorf(http.StatusInsufficientStorage, "snapshot over %d bytes (or its manifest over %d): page the manifest instead",
	manifest.SnapshotLimit, manifest.MaxSnapshotManifestBytes)

// buildSnapshot writes the snapshot of an edge at seq to f, reading one
// artifact at a time from the store, and returns its size. It refuses
// (507) what an edge would refuse: a manifest.json, an expansion or a file
// over their bounds.
func (s *Server) buildSnapshot(ctx context.Context, f *os.File, edge string, seq int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	h, sig, assign, err := s.st.HeaderAssignments(ctx, edge, seq)
	if err != nil {
		return 0, err
	}
	m := manifest.Manifest{EdgeID: edge, Sequence: seq, Header: h, HeaderSignature: sig, Assignments: assign}
	var artifacts int64
	for from := ""; ; {
		entries, err := s.st.Entries(ctx, edge, seq, from, manifest.MaxEntries)
		if err != nil {
			return 0, err
		}
		for _, e := range entries {
			artifacts += e.Size
		}
		m.Entries = append(m.Entries, entries...)
		// ~400 bytes of JSON an entry: stop reading long before a manifest
		// that cannot be served is whole in memory.
		if artifacts > manifest.SnapshotLimit || len(m.Entries) > manifest.MaxSnapshotManifestBytes/200 {
			return 0, errSnapshotTooBig
		}
		if len(entries) < manifest.MaxEntries {
			break
		}
		from = entries[len(entries)-1].Domain
	}
	mj, err := json.Marshal(m)
	if err != nil {
		return 0, err
	}
	// The tar stream: a 512-byte header and content padded to 512 bytes
	// per file, then two zero blocks.
	expanded := tarSize(int64(len(mj))) + 1024
	for _, e := range m.Entries {
		expanded += tarSize(e.Size)
	}
	if len(mj) > manifest.MaxSnapshotManifestBytes || expanded > manifest.SnapshotLimit {
		return 0, errSnapshotTooBig
	}
	bw := bufio.NewWriterSize(f, 64<<10)
	sw, err := manifest.NewSnapshotWriter(bw, m)
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	for _, e := range m.Entries {
		if seen[e.SHA256] {
			continue
		}
		seen[e.SHA256] = true
		data, err := s.st.Artifact(ctx, edge, e.SHA256)
		if err != nil {
			return 0, err
		}
		if err := sw.Artifact(e.SHA256, data); err != nil {
			return 0, fmt.Errorf("write snapshot: %w", err)
		}
	}
	if err := sw.Close(); err != nil {
		return 0, fmt.Errorf("write snapshot: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return 0, fmt.Errorf("write snapshot: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if st.Size() > manifest.SnapshotLimit {
		return 0, errSnapshotTooBig
	}
	return st.Size(), nil
}

func tarSize(n int64) int64 { return 512 + (n+511)/512*512 }
