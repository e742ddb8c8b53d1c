// Package snapcache keeps the recovery snapshots a control replica
// serves: each edge's, built once per manifest sequence into an unlinked
// file and served from it to every download, with download slots shared
// out per edge and per org and a minimum rate below which a download is
// cut. What a snapshot holds is controlapi's, which builds and serves
// them; only controlapi imports it.
package snapcache

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Options configure a Cache.
type Options struct {
	// Dir holds the snapshot files, unlinked at once (nothing stays
	// there); empty means the system's temporary directory.
	Dir string
	// Downloads bounds the snapshots served at a time; PerEdge and PerOrg
	// are one edge's and one org's shares of them. Required.
	Downloads, PerEdge, PerOrg int
	// MinRate is the slowest a download may be on average, bytes a
	// second, after a grace of a few seconds. Required.
	MinRate int64
	// Logger, or nil for none.
	Logger *zap.Logger
}

// BusyError is a download refused for want of a slot.
type BusyError struct {
	status int
	msg    string
}

func busyf(status int, format string, args ...any) error {
	return &BusyError{status: status, msg: fmt.Sprintf(format, args...)}
}

func (e *BusyError) Error() string { return e.msg }

// Status is the HTTP status of the refusal: 503 while the replica serves
// as many downloads as it may, 429 while the edge or its org holds its
// share.
func (e *BusyError) Status() int { return e.status }

// grace is the time a download has before its average rate counts
// (a TCP window opening, a slow start).
const grace = 5 * time.Second

// maxTime is the longest a download is served: the edge listener's write
// timeout (controlapi.Serve), which the rate's deadlines must not extend.
const maxTime = 5 * time.Minute

// Cache builds each edge's recovery snapshot once per sequence into a
// file, and serves every download of it from that file: a download costs
// the copy buffers of one connection, not the snapshot. The files are
// unlinked as soon as they are created, so that nothing is left on disk
// after a crash or a restart, and closed (their space freed) once replaced
// by a newer sequence's or evicted and no download reads them. At most
// Options.Downloads downloads and builds run at a time; beyond, the edge
// is told to come back later (a BusyError, 503 with Retry-After), which it
// does as for any failed poll.
type Cache struct {
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
	files   map[string]*File
	clock   uint64 // counts uses, for eviction
}

// File is one edge's snapshot at one sequence.
type File struct {
	edge  string
	seq   int64
	ready chan struct{} // closed once built (or failed)

	// Set before ready is closed, then read-only.
	f    *os.File
	size int64
	at   time.Time
	err  error

	refs    int    // downloads reading f; guarded by Cache.mu
	evicted bool   // no longer in files; guarded by Cache.mu
	used    uint64 // Cache.clock at its last use; guarded by Cache.mu
}

// New checks o and fills its defaults.
func New(o Options) (*Cache, error) {
	if o.Downloads < 1 || o.PerEdge < 1 || o.PerOrg < 1 || o.MinRate < 1 {
		return nil, fmt.Errorf("snapcache: downloads %d, per edge %d, per org %d, minimum rate %d: want each 1 or more",
			o.Downloads, o.PerEdge, o.PerOrg, o.MinRate)
	}
	if o.Dir == "" {
		o.Dir = os.TempDir()
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return &Cache{dir: o.Dir, max: o.Downloads, perEdge: o.PerEdge, perOrg: o.PerOrg, minRate: o.MinRate, log: o.Logger,
		files: map[string]*File{}, byEdge: map[string]int{}, byOrg: map[string]int{}}, nil
}

// Seq is the manifest sequence the snapshot holds.
func (sf *File) Seq() int64 { return sf.seq }

// Size is the snapshot's size in bytes, once built.
func (sf *File) Size() int64 { return sf.size }

// maxFiles bounds the snapshots kept between downloads (each one up to
// manifest.SnapshotLimit of disk).
func (ss *Cache) maxFiles() int { return 2 * ss.max }

// Take takes a download slot for edge of org, or answers why not with a
// BusyError: 503 when the replica serves as many as it may, 429 when the
// edge or its org holds its share. release gives the slot back.
func (ss *Cache) Take(edge, org string) (release func(), _ error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	switch {
	case ss.serving >= ss.max:
		return nil, busyf(http.StatusServiceUnavailable, "%d recovery snapshots are being served; retry later, or page the manifest", ss.max)
	case ss.byEdge[edge] >= ss.perEdge:
		return nil, busyf(http.StatusTooManyRequests, "edge %s is downloading its snapshot already; page the manifest", edge)
	case ss.byOrg[org] >= ss.perOrg:
		return nil, busyf(http.StatusTooManyRequests, "org %s's edges hold %d of the %d snapshot downloads, its share; page the manifest", org, ss.byOrg[org], ss.max)
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

// Acquire returns the edge's snapshot at seq, or a newer one, building it
// with build if no download has yet; the caller releases it.
func (ss *Cache) Acquire(ctx context.Context, edge string, seq int64, build func(*os.File) (int64, error)) (*File, error) {
	ss.mu.Lock()
	sf := ss.files[edge]
	if sf == nil || sf.seq < seq || sf.failed() {
		if sf != nil {
			ss.evictLocked(sf)
		}
		sf = &File{edge: edge, seq: seq, ready: make(chan struct{})}
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
		ss.Release(sf)
		return nil, ctx.Err()
	}
	if sf.err != nil {
		ss.Release(sf)
		return nil, sf.err
	}
	return sf, nil
}

// failed reports a build that failed; the caller holds ss.mu.
func (sf *File) failed() bool {
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
func (ss *Cache) build(sf *File, build func(*os.File) (int64, error)) {
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

// Release ends a download of sf.
func (ss *Cache) Release(sf *File) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sf.refs--
	ss.closeIfDoneLocked(sf)
}

// evictLocked forgets sf; its file closes when its last download ends.
func (ss *Cache) evictLocked(sf *File) {
	if ss.files[sf.edge] == sf {
		delete(ss.files, sf.edge)
	}
	sf.evicted = true
	ss.closeIfDoneLocked(sf)
}

func (ss *Cache) closeIfDoneLocked(sf *File) {
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
func (ss *Cache) trimLocked() {
	for len(ss.files) > ss.maxFiles() {
		var lru *File
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

// Close closes every file (at shutdown, once no download runs).
func (ss *Cache) Close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, sf := range ss.files {
		ss.evictLocked(sf)
	}
}

// Serve sends sf, held to the minimum rate: a reader slower than it
// finds the download cut (err, with the bytes sent so far).
func (ss *Cache) Serve(w http.ResponseWriter, r *http.Request, sf *File) (sent int64, err error) {
	rw := &rateWriter{ResponseWriter: w, rc: http.NewResponseController(w), start: time.Now(), rate: ss.minRate}
	http.ServeContent(rw, r, "", sf.at, io.NewSectionReader(sf.f, 0, sf.size))
	return rw.written, rw.err
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
	due := rw.start.Add(grace + time.Duration(float64(rw.written+int64(len(p)))/float64(rw.rate)*float64(time.Second)))
	if last := rw.start.Add(maxTime); due.After(last) {
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
