package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Gateway is one of an edge's public services (a gateway row): what the
// agent reports (service, protocol, host, port, TLS posture, topology,
// ranking, health) and the front-door URL only an operator sets.
type Gateway struct {
	EdgeID   string
	Service  string
	Protocol string
	Host     string
	Port     int
	TLS      bool
	MTLS     bool
	Region   string
	Zone     string
	Locality string
	Priority int
	CostTier int
	Weight   int
	RTT      time.Duration
	Healthy  bool
	LastSeen time.Time
	// FrontDoorURL is the operator-set front door, canonical, or "".
	FrontDoorURL string
	FrontDoorAt  time.Time
	// Org is the edge's org (read only: joined from edges).
	Org string
}

const gatewayColumns = `g.edge_id, g.service, g.protocol, g.host, g.port, g.tls, g.mtls, g.region, g.zone, g.locality,
	g.priority, g.cost_tier, g.weight, g.rtt_us, g.healthy, g.last_seen, g.front_door_url, g.front_door_at, e.org`

func scanGateway(r scanner) (Gateway, error) {
	var g Gateway
	var tls, mtls, healthy int
	var rtt, seen, fdAt int64
	err := r.Scan(&g.EdgeID, &g.Service, &g.Protocol, &g.Host, &g.Port, &tls, &mtls, &g.Region, &g.Zone, &g.Locality,
		&g.Priority, &g.CostTier, &g.Weight, &rtt, &healthy, &seen, &g.FrontDoorURL, &fdAt, &g.Org)
	g.TLS, g.MTLS, g.Healthy = tls != 0, mtls != 0, healthy != 0
	g.RTT, g.LastSeen, g.FrontDoorAt = time.Duration(rtt)*time.Microsecond, fromMS(seen), fromMS(fdAt)
	return g, err
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// SyncGateways applies an edge's reported gateways, seen at at: each
// reported service's row is inserted or has its reported fields refreshed;
// a row the report no longer names is removed unless it holds a front door,
// which is kept and marked unhealthy. The front-door URL is never written
// here: it survives every sync.
func (s *Store) SyncGateways(ctx context.Context, edgeID string, gws []Gateway, at time.Time) error {
	return s.tx(ctx, func(tx *sql.Tx) error { return s.syncGateways(ctx, tx, edgeID, gws, at) })
}

// syncGateways is SyncGateways inside tx.
func (s *Store) syncGateways(ctx context.Context, tx *sql.Tx, edgeID string, gws []Gateway, at time.Time) error {
	reported := map[string]bool{}
	for _, g := range gws {
		reported[g.Service] = true
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO gateways (edge_id, service, protocol, host, port, tls, mtls, region, zone, locality,
			priority, cost_tier, weight, rtt_us, healthy, last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (edge_id, service) DO UPDATE SET protocol = excluded.protocol, host = excluded.host, port = excluded.port,
			tls = excluded.tls, mtls = excluded.mtls, region = excluded.region, zone = excluded.zone, locality = excluded.locality,
			priority = excluded.priority, cost_tier = excluded.cost_tier, weight = excluded.weight, rtt_us = excluded.rtt_us,
			healthy = excluded.healthy, last_seen = excluded.last_seen`),
			edgeID, g.Service, g.Protocol, g.Host, g.Port, b2i(g.TLS), b2i(g.MTLS), g.Region, g.Zone, g.Locality,
			g.Priority, g.CostTier, g.Weight, g.RTT.Microseconds(), b2i(g.Healthy), ms(at))
		if err != nil {
			return fmt.Errorf("sync gateway %s of edge %s: %w", g.Service, edgeID, err)
		}
	}
	rows, err := tx.QueryContext(ctx, s.q(`SELECT service, front_door_url FROM gateways WHERE edge_id = ?`), edgeID)
	if err != nil {
		return fmt.Errorf("sync gateways of edge %s: %w", edgeID, err)
	}
	var gone, stale []string
	for rows.Next() {
		var svc, url string
		if err := rows.Scan(&svc, &url); err != nil {
			rows.Close()
			return fmt.Errorf("sync gateways of edge %s: %w", edgeID, err)
		}
		if !reported[svc] {
			if url == "" {
				gone = append(gone, svc)
			} else {
				stale = append(stale, svc)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sync gateways of edge %s: %w", edgeID, err)
	}
	for _, svc := range gone {
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM gateways WHERE edge_id = ? AND service = ?`), edgeID, svc); err != nil {
			return fmt.Errorf("sync gateways of edge %s: %w", edgeID, err)
		}
	}
	for _, svc := range stale {
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE gateways SET healthy = 0 WHERE edge_id = ? AND service = ?`), edgeID, svc); err != nil {
			return fmt.Errorf("sync gateways of edge %s: %w", edgeID, err)
		}
	}
	return nil
}

// SetFrontDoor makes url (canonical: the caller normalizes it) the front
// door of the edge's gateway service, creating the row if the agent has
// not reported it yet and moving the edge's front door from another of its
// services, and returns the row as set. ErrConflict: another edge holds
// url (the error names it, by id and name). ErrNotFound: no such edge.
//
// Sets of one edge are serialized on the edge's row (on PostgreSQL; SQLite
// serializes every write), so that two never wait on each other's gateway
// rows. A set that loses a race for url to another edge's (the unique
// index refuses it) runs again and reads who holds it; one the database
// cannot serialize (a PostgreSQL deadlock or serialization failure, SQLite
// busy) runs again too, while ctx lasts.
func (s *Store) SetFrontDoor(ctx context.Context, edgeID, service, url string) (Gateway, error) {
	if url == "" {
		return Gateway{}, errors.New("set front door: empty url (clear it instead)")
	}
	lock := `SELECT 1 FROM edges WHERE id = ?`
	if s.dialect == Postgres {
		lock += ` FOR UPDATE`
	}
	var g Gateway
	var err error
	for range 5 {
		err = s.retryTx(ctx, func(tx *sql.Tx) error {
			var one int
			if err := tx.QueryRowContext(ctx, s.q(lock), edgeID).Scan(&one); err != nil {
				if errors.Is(err, sql.ErrNoRows) {
					return fmt.Errorf("set front door of edge %s: %w", edgeID, ErrNotFound)
				}
				return err
			}
			var holder, name string
			err := tx.QueryRowContext(ctx, s.q(`SELECT g.edge_id, e.name FROM gateways g JOIN edges e ON e.id = g.edge_id WHERE g.front_door_url = ?`), url).
				Scan(&holder, &name)
			switch {
			case err == nil && holder != edgeID:
				return fmt.Errorf("set front door %s: edge %s (%s) holds it: %w", url, holder, name, ErrConflict)
			case err != nil && !errors.Is(err, sql.ErrNoRows):
				return err
			}
			now := ms(s.Now())
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE gateways SET front_door_url = '', front_door_at = ? WHERE edge_id = ? AND service <> ? AND front_door_url <> ''`),
				now, edgeID, service); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO gateways (edge_id, service, front_door_url, front_door_at) VALUES (?, ?, ?, ?)
				ON CONFLICT (edge_id, service) DO UPDATE SET front_door_url = excluded.front_door_url, front_door_at = excluded.front_door_at`),
				edgeID, service, url, now); err != nil {
				return err
			}
			// Read back in the transaction: what this set wrote, not what a
			// later one made of it.
			g, err = scanGateway(tx.QueryRowContext(ctx, s.q(`SELECT `+gatewayColumns+` FROM gateways g JOIN edges e ON e.id = g.edge_id
				WHERE g.edge_id = ? AND g.service = ?`), edgeID, service))
			return err
		})
		if !isUnique(err) || ctx.Err() != nil {
			break
		}
		// Another edge's set took url between this one's read of the
		// holder and its write: the next run names it.
	}
	switch {
	case err == nil:
		return g, nil
	case isUnique(err):
		return Gateway{}, fmt.Errorf("set front door %s: another edge took it at the same time: %w", url, ErrConflict)
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict):
		return Gateway{}, err
	}
	return Gateway{}, fmt.Errorf("set front door of edge %s: %w", edgeID, err)
}

// ClearFrontDoor removes the edge's front door; it reports whether there
// was one.
func (s *Store) ClearFrontDoor(ctx context.Context, edgeID string) (bool, error) {
	res, err := s.execLocked(ctx, s.q(`UPDATE gateways SET front_door_url = '', front_door_at = ? WHERE edge_id = ? AND front_door_url <> ''`),
		ms(s.Now()), edgeID)
	if err != nil {
		return false, fmt.Errorf("clear front door of edge %s: %w", edgeID, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// Gateways returns gateway rows, by edge and service: of one edge, or all
// for edgeID "".
func (s *Store) Gateways(ctx context.Context, edgeID string) ([]Gateway, error) {
	q := `SELECT ` + gatewayColumns + ` FROM gateways g JOIN edges e ON e.id = g.edge_id`
	var args []any
	if edgeID != "" {
		q += ` WHERE g.edge_id = ?`
		args = append(args, edgeID)
	}
	return s.queryGateways(ctx, q+` ORDER BY g.edge_id, g.service`, args...)
}

// FrontDoors returns the rows holding a front door, by URL: an org's, or
// every org's for org "".
func (s *Store) FrontDoors(ctx context.Context, org string) ([]Gateway, error) {
	q := `SELECT ` + gatewayColumns + ` FROM gateways g JOIN edges e ON e.id = g.edge_id WHERE g.front_door_url <> ''`
	var args []any
	if org != "" {
		q += ` AND e.org = ?`
		args = append(args, org)
	}
	return s.queryGateways(ctx, q+` ORDER BY g.front_door_url`, args...)
}

func (s *Store) queryGateways(ctx context.Context, q string, args ...any) ([]Gateway, error) {
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, fmt.Errorf("gateways: %w", err)
	}
	defer rows.Close()
	var out []Gateway
	for rows.Next() {
		g, err := scanGateway(rows)
		if err != nil {
			return nil, fmt.Errorf("gateways: %w", err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("gateways: %w", err)
	}
	return out, nil
}

// EdgeOrg returns an edge's org: the one column the edge's front-door
// fetch needs, without the edge's status report.
func (s *Store) EdgeOrg(ctx context.Context, edgeID string) (string, error) {
	var org string
	err := s.db.QueryRowContext(ctx, s.q(`SELECT org FROM edges WHERE id = ?`), edgeID).Scan(&org)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("edge %s: %w", edgeID, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("edge %s: %w", edgeID, err)
	}
	return org, nil
}
