package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The metrics' scrape-time queries: read-only, one statement each,
// bounded by the fleet's size.

// ReportStamp identifies an enrolled edge's latest status report as
// written: by the report's own time (ms). Every write of a report moves it
// (an agent stamps each report with its clock, and an unchanged report is
// not written but for the periodic rewrite, which is stamped anew), so a
// reader can keep what it derived from a report until its stamp moves,
// without reading the report (its length would: SQLite counts a text's
// characters, PostgreSQL detoasts it).
type ReportStamp struct {
	ID   string
	AtMS int64
}

// EdgeReport is a report with its stamp.
type EdgeReport struct {
	ReportStamp
	Status []byte
}

// ReportStamps returns the stamp of every enrolled edge's latest status
// report, for the edges that have sent one: no report is read.
func (s *Store) ReportStamps(ctx context.Context) ([]ReportStamp, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, status_at FROM edges WHERE cert_serial <> '' AND status <> '' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("report stamps: %w", err)
	}
	defer rows.Close()
	var out []ReportStamp
	for rows.Next() {
		var r ReportStamp
		if err := rows.Scan(&r.ID, &r.AtMS); err != nil {
			return nil, fmt.Errorf("report stamps: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// maxReportsBatch bounds the ids of one EdgeReports query.
const maxReportsBatch = 500

// EdgeReports returns the latest status reports, with their stamps, of
// the edges ids names that have one.
func (s *Store) EdgeReports(ctx context.Context, ids []string) ([]EdgeReport, error) {
	var out []EdgeReport
	for len(ids) > 0 {
		batch := ids[:min(len(ids), maxReportsBatch)]
		ids = ids[len(batch):]
		args := make([]any, len(batch))
		for i, id := range batch {
			args[i] = id
		}
		marks := strings.TrimSuffix(strings.Repeat("?, ", len(batch)), ", ")
		rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, status_at, status FROM edges WHERE status <> '' AND id IN (`+marks+`)`), args...)
		if err != nil {
			return nil, fmt.Errorf("edge reports: %w", err)
		}
		for rows.Next() {
			var r EdgeReport
			var status string
			if err := rows.Scan(&r.ID, &r.AtMS, &status); err != nil {
				rows.Close()
				return nil, fmt.Errorf("edge reports: %w", err)
			}
			r.Status = []byte(status)
			out = append(out, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("edge reports: %w", err)
		}
	}
	return out, nil
}

// EdgePools returns, for every edge with cells assigned, the pools its
// cells are assigned to and how many cells each.
func (s *Store) EdgePools(ctx context.Context) (map[string]map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT edge_id, pool, COUNT(*) FROM assignments GROUP BY edge_id, pool`)
	if err != nil {
		return nil, fmt.Errorf("edge pools: %w", err)
	}
	defer rows.Close()
	out := map[string]map[string]int{}
	for rows.Next() {
		var edge, pool string
		var n int
		if err := rows.Scan(&edge, &pool, &n); err != nil {
			return nil, fmt.Errorf("edge pools: %w", err)
		}
		if out[edge] == nil {
			out[edge] = map[string]int{}
		}
		out[edge][pool] = n
	}
	return out, rows.Err()
}

// PoolDomains counts the domains (not deleted) whose active pool is each
// pool; a pool with none is absent.
func (s *Store) PoolDomains(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT pool, COUNT(*) FROM domains WHERE deleted = 0 GROUP BY pool`)
	if err != nil {
		return nil, fmt.Errorf("pool domains: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var pool string
		var n int
		if err := rows.Scan(&pool, &n); err != nil {
			return nil, fmt.Errorf("pool domains: %w", err)
		}
		out[pool] = n
	}
	return out, rows.Err()
}

// HeldLease is an egress lease not yet expired, with its holder's name,
// region and zone (empty for a holder since deleted).
type HeldLease struct {
	Lease
	HolderName, Region, Zone string
}

// HeldLeases returns up to limit egress leases active and unexpired at
// now, by org and class, and how many there are in all.
func (s *Store) HeldLeases(ctx context.Context, now time.Time, limit int) ([]HeldLease, int, error) {
	var total int
	if err := s.db.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM egress_leases WHERE active = 1 AND expires_at > ?`), ms(now)).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("held leases: %w", err)
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT l.org, l.class, l.holder, l.epoch, l.acquired_at, l.renewed_at, l.expires_at,
		COALESCE(e.name, ''), COALESCE(e.region, ''), COALESCE(e.zone, '')
		FROM egress_leases l LEFT JOIN edges e ON e.id = l.holder
		WHERE l.active = 1 AND l.expires_at > ? ORDER BY l.org, l.class LIMIT ?`), ms(now), limit)
	if err != nil {
		return nil, 0, fmt.Errorf("held leases: %w", err)
	}
	defer rows.Close()
	var out []HeldLease
	for rows.Next() {
		var h HeldLease
		var acq, ren, exp int64
		if err := rows.Scan(&h.Org, &h.Class, &h.Holder, &h.Epoch, &acq, &ren, &exp, &h.HolderName, &h.Region, &h.Zone); err != nil {
			return nil, 0, fmt.Errorf("held leases: %w", err)
		}
		h.AcquiredAt, h.RenewedAt, h.ExpiresAt = fromMS(acq), fromMS(ren), fromMS(exp)
		out = append(out, h)
	}
	return out, total, rows.Err()
}
