package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"
)

// Governed egress: edges' topology and ranking, their latest egress
// report, egress policies per (org, class), and leases with their fencing
// epochs.

// ErrLeaseHeld is a lost race: another holder's lease is active.
var ErrLeaseHeld = errors.New("lease held by another edge")

// ErrLeaseLost is a renewal or release of a lease that is no longer the
// caller's current one (expired, superseded or released).
var ErrLeaseLost = errors.New("lease lost")

// Topology is where an edge is and how it ranks as an egress owner.
type Topology struct {
	Region string
	Zone   string
	// Priority: lower is preferred. CostTier: lower is preferred. Weight:
	// higher is preferred.
	Priority int
	CostTier int
	Weight   int
}

// DefaultTopology is an edge's ranking unless the admin sets one.
var DefaultTopology = Topology{Priority: 100, CostTier: 0, Weight: 100}

// SetTopology replaces an edge's topology and ranking.
func (s *Store) SetTopology(ctx context.Context, id string, t Topology) error {
	res, err := s.execLocked(ctx, s.q(`UPDATE edges SET region = ?, zone = ?, priority = ?, cost_tier = ?, weight = ? WHERE id = ?`),
		t.Region, t.Zone, t.Priority, t.CostTier, t.Weight, id)
	if err != nil {
		return fmt.Errorf("topology of edge %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("edge %s: %w", id, ErrNotFound)
	}
	return nil
}

// Reach is an edge's latest probe of a class's destination.
type Reach struct {
	Destination string
	Reachable   bool
	CheckedAt   time.Time
}

// PutEgressReport replaces the egress part of an edge's status report:
// its intake URL and its probes by class (already checked and put on
// this clock by the caller).
func (s *Store) PutEgressReport(ctx context.Context, id, intakeURL string, reach map[string]Reach) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE edges SET egress_intake = ? WHERE id = ?`), intakeURL, id); err != nil {
			return err
		}
		return s.putReach(ctx, tx, id, reach)
	})
	if err != nil {
		return fmt.Errorf("egress report of edge %s: %w", id, err)
	}
	return nil
}

// putReach replaces an edge's probes by reach, inside tx.
func (s *Store) putReach(ctx context.Context, tx *sql.Tx, id string, reach map[string]Reach) error {
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM edge_reach WHERE edge_id = ?`), id); err != nil {
		return fmt.Errorf("egress probes of edge %s: %w", id, err)
	}
	for class, r := range reach {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO edge_reach (edge_id, class, destination, reachable, checked_at) VALUES (?, ?, ?, ?, ?)`),
			id, class, r.Destination, b2i(r.Reachable), ms(r.CheckedAt)); err != nil {
			return fmt.Errorf("egress probe %s of edge %s: %w", class, id, err)
		}
	}
	return nil
}

// EgressEdge is an edge as governed egress reads it: its org, topology,
// last sighting and intake, without its status report.
type EgressEdge struct {
	ID, Org string
	Topology
	LastSeen  time.Time
	IntakeURL string
	Enrolled  bool
}

// EgressEdge returns the edge id as governed egress reads it, or
// ErrNotFound.
func (s *Store) EgressEdge(ctx context.Context, id string) (EgressEdge, error) {
	var e EgressEdge
	var seen int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT id, org, region, zone, priority, cost_tier, weight, last_seen, egress_intake,
		CASE WHEN cert_serial <> '' THEN 1 ELSE 0 END FROM edges WHERE id = ?`), id).
		Scan(&e.ID, &e.Org, &e.Region, &e.Zone, &e.Priority, &e.CostTier, &e.Weight, &seen, &e.IntakeURL, &e.Enrolled)
	if errors.Is(err, sql.ErrNoRows) {
		return EgressEdge{}, fmt.Errorf("edge %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return EgressEdge{}, fmt.Errorf("edge %s: %w", id, err)
	}
	e.LastSeen = fromMS(seen)
	return e, nil
}

// EgressGroup is a set of an org's enrolled edges that an election tells
// apart only by id: the same topology and ranking, the same reach of the
// class's destination, on the same side of the live bound.
type EgressGroup struct {
	Topology
	// Reachable: their latest probe of the class reached dest, checked
	// since fresh.
	Reachable bool
	// Live: each was last seen, as stored, at or after live; otherwise
	// only at or after since (another replica's sighting not yet written
	// may still make one live).
	Live bool
	// N is how many edges the group has.
	N int
	// ids are their ids joined by commas: one string per group, not one
	// per edge.
	ids string
}

// IDs yields the group's edge ids, substrings of one string.
func (g EgressGroup) IDs() iter.Seq[string] { return strings.SplitSeq(g.ids, ",") }

// EgressGroups returns the org's enrolled edges last seen at or after
// since, grouped by what an election reads of them (EgressGroup), with
// whether their probe of class reached dest since fresh: one query over
// an index of the org and the live window that holds every column it
// reads, read afresh on every call, a few rows however many edges the
// org has.
func (s *Store) EgressGroups(ctx context.Context, org, class, dest string, since, live, fresh time.Time) ([]EgressGroup, error) {
	agg := `group_concat(e.id, ',')`
	if s.dialect == Postgres {
		agg = `string_agg(e.id, ',')`
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT e.region, e.zone, e.priority, e.cost_tier, e.weight,
		CASE WHEN r.edge_id IS NULL THEN 0 ELSE 1 END AS reach, CASE WHEN e.last_seen >= ? THEN 1 ELSE 0 END AS live, COUNT(*), `+agg+`
		FROM edges e LEFT JOIN edge_reach r ON r.edge_id = e.id AND r.class = ? AND r.destination = ? AND r.reachable = 1 AND r.checked_at >= ?
		WHERE e.org = ? AND e.last_seen >= ? AND e.cert_serial <> ''
		GROUP BY e.region, e.zone, e.priority, e.cost_tier, e.weight, reach, live`), ms(live), class, dest, ms(fresh), org, ms(since))
	if err != nil {
		return nil, fmt.Errorf("egress members of %s: %w", org, err)
	}
	defer rows.Close()
	var out []EgressGroup
	for rows.Next() {
		var g EgressGroup
		if err := rows.Scan(&g.Region, &g.Zone, &g.Priority, &g.CostTier, &g.Weight, &g.Reachable, &g.Live, &g.N, &g.ids); err != nil {
			return nil, fmt.Errorf("egress members of %s: %w", org, err)
		}
		if n := strings.Count(g.ids, ",") + 1; n != g.N {
			return nil, fmt.Errorf("egress members of %s: %d ids for %d edges (an id with a comma)", org, n, g.N)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("egress members of %s: %w", org, err)
	}
	return out, nil
}

// EgressPolicy is an org's policy for a traffic class.
type EgressPolicy struct {
	Org, Class string
	// Destination is the class's destination URL.
	Destination string
	// Region is the preferred residency region.
	Region string
	// RequireRegion and RequireZone are the hard requirement (empty: none).
	RequireRegion, RequireZone string
	UpdatedAt                  time.Time
}

// PutEgressPolicy creates or replaces a policy.
func (s *Store) PutEgressPolicy(ctx context.Context, p EgressPolicy) error {
	_, err := s.execLocked(ctx, s.q(`INSERT INTO egress_policies (org, class, destination, region, require_region, require_zone, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (org, class) DO UPDATE SET destination = excluded.destination, region = excluded.region,
		require_region = excluded.require_region, require_zone = excluded.require_zone, updated_at = excluded.updated_at`),
		p.Org, p.Class, p.Destination, p.Region, p.RequireRegion, p.RequireZone, ms(p.UpdatedAt))
	if err != nil {
		return fmt.Errorf("egress policy %s/%s: %w", p.Org, p.Class, err)
	}
	return nil
}

const policyColumns = `org, class, destination, region, require_region, require_zone, updated_at`

func scanPolicy(r scanner) (EgressPolicy, error) {
	var p EgressPolicy
	var at int64
	err := r.Scan(&p.Org, &p.Class, &p.Destination, &p.Region, &p.RequireRegion, &p.RequireZone, &at)
	p.UpdatedAt = fromMS(at)
	return p, err
}

// EgressPolicyFor returns the policy of (org, class), or ErrNotFound.
func (s *Store) EgressPolicyFor(ctx context.Context, org, class string) (EgressPolicy, error) {
	p, err := scanPolicy(s.db.QueryRowContext(ctx, s.q(`SELECT `+policyColumns+` FROM egress_policies WHERE org = ? AND class = ?`), org, class))
	if errors.Is(err, sql.ErrNoRows) {
		return EgressPolicy{}, fmt.Errorf("egress policy %s/%s: %w", org, class, ErrNotFound)
	}
	return p, err
}

// EgressPolicies lists the policies of org (every org's for ""), by org
// and class.
func (s *Store) EgressPolicies(ctx context.Context, org string) ([]EgressPolicy, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+policyColumns+` FROM egress_policies WHERE ? = '' OR org = ? ORDER BY org, class`), org, org)
	if err != nil {
		return nil, fmt.Errorf("egress policies: %w", err)
	}
	defer rows.Close()
	var out []EgressPolicy
	for rows.Next() {
		p, err := scanPolicy(rows)
		if err != nil {
			return nil, fmt.Errorf("egress policies: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// DeleteEgressPolicy removes a policy (ErrNotFound when none).
func (s *Store) DeleteEgressPolicy(ctx context.Context, org, class string) error {
	res, err := s.execLocked(ctx, s.q(`DELETE FROM egress_policies WHERE org = ? AND class = ?`), org, class)
	if err != nil {
		return fmt.Errorf("egress policy %s/%s: %w", org, class, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("egress policy %s/%s: %w", org, class, ErrNotFound)
	}
	return nil
}
