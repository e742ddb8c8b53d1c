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

// Shares of the download slots (issue 32 §3: one edge held all 16 for up
// to 5 minutes each). An agent downloads one snapshot at a time, so a
// second download of one edge while its first is served is a retry of a
// cut one or an abuse; an org gets half the slots, so that a fleet of one
// org recovering at once leaves the other half to the others. Either
// refusal is a 429, after which the agent pages the manifest instead.
// Options.SnapshotPerEdge and SnapshotPerOrg change them (tests that play
// a fleet with one edge).
const DefaultSnapshotPerEdge = 1

// DefaultSnapshotPerOrg is an org's share of n slots.
func DefaultSnapshotPerOrg(n int) int { return max(1, n/2) }

// DefaultSnapshotMinRate is the slowest a snapshot download may be, in
// bytes a second on average after snapshotGrace, when
// Options.SnapshotMinRate is zero: 256 KiB/s (2 Mbit/s) moves the largest
// snapshot (96 MiB) in about 6 minutes, past the edge listener's 5-minute
// write timeout anyway; a download slower than that holds a slot for
// nothing, and is cut.
const DefaultSnapshotMinRate = 256 << 10

// snapshotGrace is the time a download has before its average rate counts
// (a TCP window opening, a slow start).
const snapshotGrace = 5 * time.Second

// snapshotMaxTime is the longest a download is served: the edge listener's
// write timeout (Serve), which the rate's deadlines must not extend.
const snapshotMaxTime = 5 * time.Minute

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
	dir     string
	max     int   // downloads served at a time
	perEdge int   // of them, one edge's
	perOrg  int   // one org's
	minRate int64 // bytes a second
	log     *zap.Logger

	mu      sync.Mutex // guards the following fields
	serving int        // downloads under way
	byEdge  map[string]int
	byOrg   map[string]int
	files   map[string]*snapshotFile
	clock   uint64 // counts uses, for eviction
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

func newSnapshots(dir string, downloads, perEdge, perOrg int, minRate int64, log *zap.Logger) *snapshots {
	return &snapshots{dir: dir, max: downloads, perEdge: perEdge, perOrg: perOrg, minRate: minRate, log: log, files: map[string]*snapshotFile{},
		byEdge: map[string]int{}, byOrg: map[string]int{}}
}

// maxFiles bounds the snapshots kept between downloads (each one up to
// manifest.SnapshotLimit of disk).
func (ss *snapshots) maxFiles() int { return 2 * ss.max }

// take takes a download slot for edge of org, or answers why not: 503
// when the replica serves as many as it may, 429 when the edge or its org
// holds its share. release gives the slot back.
func (ss *snapshots) take(edge, org string) (release func(), _ error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	switch {
	case ss.serving >= ss.max:
		return nil, errorf(http.StatusServiceUnavailable, "%d recovery snapshots are being served; retry later, or page the manifest", ss.max)
	case ss.byEdge[edge] >= ss.perEdge:
		return nil, errorf(http.StatusTooManyRequests, "edge %s is downloading its snapshot already; page the manifest", edge)
	case ss.byOrg[org] >= ss.perOrg:
		return nil, errorf(http.StatusTooManyRequests, "org %s's edges hold %d of the %d snapshot downloads, its share; page the manifest", org, ss.byOrg[org], ss.max)
	}
	ss.serving++
	ss.byEdge[edge]++
	ss.byOrg[org]++
	return func() {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		ss.serving--
		if ss.byEdge[edge]--; ss.byEdge[edge] <= 0 {
			delete(ss.byEdge, edge)
		}
		if ss.byOrg[org]--; ss.byOrg[org] <= 0 {
			delete(ss.byOrg, org)
		}
	}, nil
}

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
// serves as many as it may, 429 while the edge or its org holds its share
// of them. A download slower than the minimum rate is cut.
func (s *Server) snapshot(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	if st.Sequence == 0 {
		return errorf(http.StatusNotFound, "edge %s has no manifest yet", st.ID)
	}
	org, err := s.st.EdgeOrg(r.Context(), st.ID)
	if err != nil {
		return fmt.Errorf("snapshot: the edge's org: %w", err)
	}
	release, err := s.snaps.take(st.ID, org)
	if err != nil {
		w.Header().Set("Retry-After", snapshotRetryAfter)
		s.log.Info("recovery snapshot download refused", zap.String("edge", st.ID), zap.String("org", org), zap.Error(err))
		return err
	}
	defer release()
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
	rw := &rateWriter{ResponseWriter: w, rc: http.NewResponseController(w), start: time.Now(), rate: s.snaps.minRate}
	http.ServeContent(rw, r, "", sf.at, io.NewSectionReader(sf.f, 0, sf.size))
	if rw.err != nil && r.Context().Err() == nil {
		s.log.Warn("recovery snapshot download cut: slower than the minimum rate, or gone", zap.String("edge", st.ID),
			zap.Int64("sent_bytes", rw.written), zap.Int64("bytes", sf.size), zap.Int64("min_rate_bytes_per_second", s.snaps.minRate),
			zap.Duration("after", time.Since(rw.start)), zap.Error(rw.err))
	}
	return nil
}

// rateWriter holds a download to a minimum average rate: before each
// write, the connection's write deadline is when the bytes written so far
// and these are due at the rate (after the grace), so that a reader slower
// than it finds the download cut and its slot given back.
type rateWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	start   time.Time
	rate    int64 // bytes a second
	written int64
	err     error // the first write's failure
}

func (rw *rateWriter) Write(p []byte) (int, error) {
	due := rw.start.Add(snapshotGrace + time.Duration(float64(rw.written+int64(len(p)))/float64(rw.rate)*float64(time.Second)))
	if last := rw.start.Add(snapshotMaxTime); due.After(last) {
		due = last
	}
	if err := rw.rc.SetWriteDeadline(due); err != nil && rw.err == nil {
		rw.err = fmt.Errorf("set the write deadline: %w", err)
	}
	n, err := rw.ResponseWriter.Write(p)
	rw.written += int64(n)
	if err != nil && rw.err == nil {
		rw.err = err
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (rw *rateWriter) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

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
