package controlapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/snapcache"
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
// bytes a second on average after a grace of a few seconds, when
// Options.SnapshotMinRate is zero: 256 KiB/s (2 Mbit/s) moves the largest
// snapshot (96 MiB) in about 6 minutes, past the edge listener's 5-minute
// write timeout anyway; a download slower than that holds a slot for
// nothing, and is cut.
const DefaultSnapshotMinRate = 256 << 10

// snapshotRetryAfter is what a refused download is told to wait, in
// seconds.
const snapshotRetryAfter = "10"

// snapshot serves the edge's current manifest and every artifact it names
// as a gzip'd tar (manifest.ReadSnapshot's format), built once per
// sequence and served from a file; 503 with Retry-After while the replica
// serves as many as it may, 429 while the edge or its org holds its share
// of them. A download slower than the minimum rate is cut.
func (s *Server) snapshot(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	st, err := s.build(r.Context(), st)
	if err != nil {
		return err
	}
	if st.Sequence == 0 {
		return errorf(http.StatusNotFound, "edge %s has no manifest yet", st.ID)
	}
	org, err := s.st.EdgeOrg(r.Context(), st.ID)
	if err != nil {
		return fmt.Errorf("snapshot: the edge's org: %w", err)
	}
	release, err := s.snaps.Take(st.ID, org)
	if err != nil {
		w.Header().Set("Retry-After", snapshotRetryAfter)
		s.log.Info("recovery snapshot download refused", zap.String("edge", st.ID), zap.String("org", org), zap.Error(err))
		var busy *snapcache.BusyError
		if errors.As(err, &busy) {
			return &apiError{Status: busy.Status(), Message: busy.Error()}
		}
		return err
	}
	defer release()
	sf, err := s.snaps.Acquire(r.Context(), st.ID, st.Sequence, func(f *os.File) (int64, error) {
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
	defer s.snaps.Release(sf)
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("ETag", etag(sf.Seq()))
	start := time.Now()
	sent, err := s.snaps.Serve(w, r, sf)
	if err != nil && r.Context().Err() == nil {
		s.log.Warn("recovery snapshot download cut: slower than the minimum rate, or gone", zap.String("edge", st.ID),
			zap.Int64("sent_bytes", sent), zap.Int64("bytes", sf.Size()), zap.Int64("min_rate_bytes_per_second", s.o.SnapshotMinRate),
			zap.Duration("after", time.Since(start)), zap.Error(err))
	}
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
