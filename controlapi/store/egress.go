package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE edges SET region = ?, zone = ?, priority = ?, cost_tier = ?, weight = ? WHERE id = ?`),
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
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM edge_reach WHERE edge_id = ?`), id); err != nil {
			return err
		}
		for class, r := range reach {
			ok := 0
			if r.Reachable {
				ok = 1
			}
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO edge_reach (edge_id, class, destination, reachable, checked_at) VALUES (?, ?, ?, ?, ?)`),
				id, class, r.Destination, ok, ms(r.CheckedAt)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("egress report of edge %s: %w", id, err)
	}
	return nil
}

// EgressMember is an enrolled edge of an org as an election reads it.
type EgressMember struct {
	ID string
	Topology
	LastSeen  time.Time
	IntakeURL string
	// Reachable: its latest probe of the class reached dest, checked
	// since fresh.
	Reachable bool
}

// EgressMembers returns the org's enrolled edges last seen at or after
// since, with whether each one's probe of class reached dest since fresh:
// one indexed query, read afresh on every call.
func (s *Store) EgressMembers(ctx context.Context, org, class, dest string, since, fresh time.Time) ([]EgressMember, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT e.id, e.region, e.zone, e.priority, e.cost_tier, e.weight, e.last_seen, e.egress_intake,
		r.edge_id IS NOT NULL FROM edges e LEFT JOIN edge_reach r ON r.edge_id = e.id AND r.class = ? AND r.destination = ? AND r.reachable = 1
		AND r.checked_at >= ? WHERE e.org = ? AND e.last_seen >= ? AND e.cert_serial <> ''`), class, dest, ms(fresh), org, ms(since))
	if err != nil {
		return nil, fmt.Errorf("egress members of %s: %w", org, err)
	}
	defer rows.Close()
	var out []EgressMember
	for rows.Next() {
		var m EgressMember
		var seen int64
		if err := rows.Scan(&m.ID, &m.Region, &m.Zone, &m.Priority, &m.CostTier, &m.Weight, &seen, &m.IntakeURL, &m.Reachable); err != nil {
			return nil, fmt.Errorf("egress members of %s: %w", org, err)
		}
		m.LastSeen = fromMS(seen)
		out = append(out, m)
	}
	return out, rows.Err()
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
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO egress_policies (org, class, destination, region, require_region, require_zone, updated_at)
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
	res, err := s.db.ExecContext(ctx, s.q(`DELETE FROM egress_policies WHERE org = ? AND class = ?`), org, class)
	if err != nil {
		return fmt.Errorf("egress policy %s/%s: %w", org, class, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("egress policy %s/%s: %w", org, class, ErrNotFound)
	}
	return nil
}
