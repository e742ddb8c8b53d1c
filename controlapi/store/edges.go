package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"cellvisor/manifest"
)

// Edge is one edge as stored, without its bootstrap token (only its hash is
// kept, and never returned).
type Edge struct {
	ID        string
	Name      string
	Org       string
	Country   string
	Continent string
	MgmtIPv4  string
	MgmtIPv6  string
	Slots     int
	// CSRHash is the SHA-256 of the CSR that consumed the current token;
	// empty while it is unconsumed.
	CSRHash string
	// TokenExpiresAt is when the current bootstrap token stops enrolling;
	// zero for none.
	TokenExpiresAt time.Time
	// CertPEM and CertSerial are the current client certificate; empty
	// before enrollment and after a rotation.
	CertPEM    string
	CertSerial string
	// PendingCSRHash, PendingCertPEM and PendingSerial are a renewed
	// certificate the edge has not used yet: the current one stays valid
	// until it does. Empty when none is pending.
	PendingCSRHash string
	PendingCertPEM string
	PendingSerial  string
	Rotations      int
	// Sequence is the newest manifest sequence; ActiveSequence the newest
	// one the edge acknowledged as applied.
	Sequence       int64
	ActiveSequence int64
	EnrolledAt     time.Time
	LastSeen       time.Time
	Status         []byte
	StatusAt       time.Time
	CreatedAt      time.Time
	// Topology and ranking for governed egress (see Egress).
	Topology
}

// Enrolled reports whether the edge holds a valid certificate.
func (e Edge) Enrolled() bool { return e.CertSerial != "" }

// NewEdge is an edge to create.
type NewEdge struct {
	ID, Name, Org, Country, Continent, MgmtIPv4, MgmtIPv6 string
	Slots                                                 int
	// TokenHash is the SHA-256 of the one-time bootstrap token.
	TokenHash string
	// TokenExpiresAt is when the token stops enrolling; zero for never.
	TokenExpiresAt time.Time
	// Assignments maps cells to pools.
	Assignments map[string]string
	// Topology is the edge's region, zone and egress ranking, stored as
	// given (DefaultTopology has the shipped ranking).
	Topology Topology
}

const edgeColumns = `id, name, org, country, continent, mgmt_ipv4, mgmt_ipv6, slots, csr_hash, cert_pem, cert_serial,
	rotations, sequence, active_sequence, enrolled_at, last_seen, status, status_at, created_at,
	token_expires_at, pending_csr_hash, pending_cert_pem, pending_serial, region, zone, priority, cost_tier, weight`

type scanner interface{ Scan(...any) error }

func scanEdge(r scanner) (Edge, error) {
	var e Edge
	var enrolled, seen, statusAt, created, tokenExpires int64
	var status string
	err := r.Scan(&e.ID, &e.Name, &e.Org, &e.Country, &e.Continent, &e.MgmtIPv4, &e.MgmtIPv6, &e.Slots, &e.CSRHash,
		&e.CertPEM, &e.CertSerial, &e.Rotations, &e.Sequence, &e.ActiveSequence, &enrolled, &seen, &status, &statusAt, &created,
		&tokenExpires, &e.PendingCSRHash, &e.PendingCertPEM, &e.PendingSerial,
		&e.Region, &e.Zone, &e.Priority, &e.CostTier, &e.Weight)
	e.EnrolledAt, e.LastSeen, e.StatusAt, e.CreatedAt = fromMS(enrolled), fromMS(seen), fromMS(statusAt), fromMS(created)
	e.TokenExpiresAt = fromMS(tokenExpires)
	if status != "" {
		e.Status = []byte(status)
	}
	return e, err
}

// CreateEdge creates an edge with its cell assignments and its first
// manifest (sequence 1), signed by sign: the domains its pools already
// hold, or none. An empty manifest is a manifest all the same: its signed
// header carries the cell assignments, and an agent activates it (its
// assigned cells start, serving no domain) instead of waiting at sequence
// 0 for a first publish.
func (s *Store) CreateEdge(ctx context.Context, n NewEdge, sign Signer) (Edge, error) {
	now := ms(s.Now())
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		tp := n.Topology
		// Its first manifest is built from everything committed: built
		// past every fan-out before this one.
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO edges (id, name, org, country, continent, mgmt_ipv4, mgmt_ipv6, slots, token_hash,
			token_expires_at, created_at, gen, built, region, zone, priority, cost_tier, weight) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			n.ID, n.Name, n.Org, n.Country, n.Continent, n.MgmtIPv4, n.MgmtIPv6, n.Slots, n.TokenHash, ms(n.TokenExpiresAt), now, gen, gen,
			tp.Region, tp.Zone, tp.Priority, tp.CostTier, tp.Weight)
		if isUnique(err) {
			return fmt.Errorf("edge name %q: %w", n.Name, ErrConflict)
		}
		if err != nil {
			return err
		}
		for cell, pool := range n.Assignments {
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO assignments (edge_id, cell, pool) VALUES (?, ?, ?)`), n.ID, cell, pool); err != nil {
				return fmt.Errorf("assign %s to %s: %w", cell, pool, err)
			}
		}
		// The domains of its pools are placed on it, each in its active
		// pool (a move's target reaches it when the move is started again).
		rows, err := tx.QueryContext(ctx, s.q(`SELECT d.name, d.pool FROM domains d
			WHERE d.deleted = 0 AND d.pool IN (SELECT pool FROM assignments WHERE edge_id = ?) ORDER BY d.name`), n.ID)
		if err != nil {
			return err
		}
		var names, pools []string
		for rows.Next() {
			var d, p string
			if err := rows.Scan(&d, &p); err != nil {
				rows.Close()
				return err
			}
			names, pools = append(names, d), append(pools, p)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		byName := map[string]Pool{}
		for i, d := range names {
			p, ok := byName[pools[i]]
			if !ok {
				if p, err = s.pool(ctx, tx, pools[i]); err != nil {
					return err
				}
				byName[p.Name] = p
			}
			// A domain with no room on the new edge's cells stays off it,
			// as it would if the cells were assigned later.
			if err := s.place(ctx, tx, d, p, n.ID, RoleActive); err != nil && !errors.Is(err, ErrUnavailable) {
				return err
			}
		}
		k, err := s.keyring(ctx, tx, sign)
		if err != nil {
			return err
		}
		for _, d := range names {
			e, ok, err := s.entryFor(ctx, tx, d, n.ID)
			if err != nil {
				return err
			}
			if ok {
				if err := s.insertEntry(ctx, tx, n.ID, 1, k.entry(n.ID, e)); err != nil {
					return err
				}
			}
		}
		if _, err = tx.ExecContext(ctx, s.q(`UPDATE edges SET sequence = 1 WHERE id = ?`), n.ID); err != nil {
			return err
		}
		return s.signHeader(ctx, tx, k, n.ID, 1)
	})
	if err != nil {
		return Edge{}, fmt.Errorf("create edge %s: %w", n.Name, err)
	}
	return s.Edge(ctx, n.ID)
}

func (s *Store) insertEntry(ctx context.Context, tx *sql.Tx, edgeID string, seq int64, e manifest.Entry) error {
	rollback := 0
	if e.Rollback {
		rollback = 1
	}
	key := ""
	if e.Key != nil {
		b, err := json.Marshal(e.Key)
		if err != nil {
			return err
		}
		key = string(b)
	}
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO manifest_entries (edge_id, domain, from_seq, pool, revision, size, sha256, rollback, signature, cells, sealed_key)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`), edgeID, e.Domain, seq, e.Pool, e.Revision, e.Size, e.SHA256, rollback, e.Signature, strings.Join(e.Cells, ","), key)
	return err
}

// Edge returns one edge, or ErrNotFound.
func (s *Store) Edge(ctx context.Context, id string) (Edge, error) {
	e, err := scanEdge(s.db.QueryRowContext(ctx, s.q(`SELECT `+edgeColumns+` FROM edges WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return Edge{}, fmt.Errorf("edge %s: %w", id, ErrNotFound)
	}
	return e, err
}

// EdgeByToken returns the edge whose current bootstrap token hashes to
// tokenHash, or ErrNotFound.
func (s *Store) EdgeByToken(ctx context.Context, tokenHash string) (Edge, error) {
	e, err := scanEdge(s.db.QueryRowContext(ctx, s.q(`SELECT `+edgeColumns+` FROM edges WHERE token_hash = ?`), tokenHash))
	if errors.Is(err, sql.ErrNoRows) {
		return Edge{}, fmt.Errorf("bootstrap token: %w", ErrNotFound)
	}
	return e, err
}

// Edges returns every edge, by name.
func (s *Store) Edges(ctx context.Context) ([]Edge, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+edgeColumns+` FROM edges ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Edge
	for rows.Next() {
		e, err := scanEdge(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// Enroll records the certificate issued for the CSR that consumed the
// edge's current token. It fails with ErrConflict when the token is not
// the edge's current one or was consumed already (by this CSR or another):
// the caller decides between an exact retry and a refusal first.
func (s *Store) Enroll(ctx context.Context, id, tokenHash, csrHash, certPEM, serial string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.q(`UPDATE edges SET csr_hash = ?, cert_pem = ?, cert_serial = ?, enrolled_at = ?, gen = ?
			WHERE id = ? AND token_hash = ? AND csr_hash = ''`), csrHash, certPEM, serial, ms(s.Now()), gen, id, tokenHash)
		if err != nil {
			return fmt.Errorf("enroll edge %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("enroll edge %s: token already consumed: %w", id, ErrConflict)
		}
		return nil
	})
}

// Rotate replaces the edge's bootstrap token (expiring at expiresAt, zero
// for never), invalidates its certificate, a pending renewed one too, and
// ends its egress leases: the edge must enroll again with the new token.
func (s *Store) Rotate(ctx context.Context, id, tokenHash string, expiresAt time.Time) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.q(`UPDATE edges SET token_hash = ?, token_expires_at = ?, csr_hash = '', cert_pem = '', cert_serial = '',
			pending_csr_hash = '', pending_cert_pem = '', pending_serial = '', rotations = rotations + 1, gen = ? WHERE id = ?`),
			tokenHash, ms(expiresAt), gen, id)
		if err != nil {
			return fmt.Errorf("rotate edge %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("rotate edge %s: %w", id, ErrNotFound)
		}
		return s.endLeases(ctx, tx, id)
	})
}

// endLeases ends every active egress lease the edge holds, inside tx: an
// edge deleted or rotated away is refused by the control API, so it can
// neither renew nor fence, and its org's next holder must not wait for
// the lease to run out.
func (s *Store) endLeases(ctx context.Context, tx *sql.Tx, id string) error {
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE egress_leases SET active = 0, ended_at = ? WHERE holder = ? AND active = 1`), ms(s.Now()), id); err != nil {
		return fmt.Errorf("end the egress leases of edge %s: %w", id, err)
	}
	return nil
}

// Touch records when edges were last seen; it never moves a time back.
func (s *Store) Touch(ctx context.Context, seen map[string]time.Time) error {
	if len(seen) == 0 {
		return nil
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	// In id order, as advance locks edges: two transactions never wait on
	// each other's rows in opposite orders.
	sort.Strings(ids)
	return s.tx(ctx, func(tx *sql.Tx) error {
		for _, id := range ids {
			at := seen[id]
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE edges SET last_seen = ? WHERE id = ? AND last_seen < ?`), ms(at), id, ms(at)); err != nil {
				return fmt.Errorf("touch edge %s: %w", id, err)
			}
		}
		return nil
	})
}

// Report is an edge's status report as PutStatus stores it: the agent's
// status object, its egress part and its gateways.
type Report struct {
	// Status is the agent's status object, At when the agent made it.
	Status []byte
	At     time.Time
	// IntakeURL and Reach are the egress part, already checked and put on
	// this clock by the caller: empty and nil clear the edge's intake and
	// probes (a report without an egress part).
	IntakeURL string
	Reach     map[string]Reach
	// Gateways are synced as SyncGateways does, seen at GatewaysAt, when
	// SyncGateways is set; otherwise the gateway rows are left as they are
	// (a report without a gateways part).
	Gateways     []Gateway
	GatewaysAt   time.Time
	SyncGateways bool
}

// PutStatus stores an edge's latest status report, its egress part and its
// gateways with it, in one transaction: one write per report. A write that
// meets a busy database (another writer holding SQLite's lock past the
// busy timeout, a PostgreSQL serialization failure or deadlock) waits its
// turn and runs again for as long as ctx lasts, instead of failing.
// ErrNotFound: no such edge (deleted meanwhile).
func (s *Store) PutStatus(ctx context.Context, id string, r Report) error {
	err := s.retryTx(ctx, func(tx *sql.Tx) error { return s.putStatus(ctx, tx, id, r) })
	if err != nil {
		return fmt.Errorf("status of edge %s: %w", id, err)
	}
	return nil
}

// putStatus is PutStatus's statements.
func (s *Store) putStatus(ctx context.Context, tx *sql.Tx, id string, r Report) error {
	res, err := tx.ExecContext(ctx, s.q(`UPDATE edges SET status = ?, status_at = ?, last_seen = ?, egress_intake = ? WHERE id = ?`),
		string(r.Status), ms(r.At), ms(s.Now()), r.IntakeURL, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("edge %s: %w", id, ErrNotFound)
	}
	if err := s.putReach(ctx, tx, id, r.Reach); err != nil {
		return err
	}
	if r.SyncGateways {
		return s.syncGateways(ctx, tx, id, r.Gateways, r.GatewaysAt)
	}
	return nil
}

// EdgeSeen is an edge's enrollment and last-seen time as written.
type EdgeSeen struct {
	ID       string
	Enrolled bool
	LastSeen time.Time
}

// LastSeen returns every edge's enrollment and last-seen time, reading
// nothing else (a scrape of the metrics reads the whole fleet).
func (s *Store) LastSeen(ctx context.Context) ([]EdgeSeen, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, cert_serial <> '', last_seen FROM edges`)
	if err != nil {
		return nil, fmt.Errorf("last seen: %w", err)
	}
	defer rows.Close()
	var out []EdgeSeen
	for rows.Next() {
		var e EdgeSeen
		var seen int64
		if err := rows.Scan(&e.ID, &e.Enrolled, &seen); err != nil {
			return nil, fmt.Errorf("last seen: %w", err)
		}
		e.LastSeen = fromMS(seen)
		out = append(out, e)
	}
	return out, rows.Err()
}

// EdgeState is what the poll path needs of an edge, cached by controlapi.
type EdgeState struct {
	ID           string
	CertSerial   string
	Sequence     int64
	PendingTasks int
	Gen          int64
	// Built is the generation the edge's manifest is built to: a fan-out
	// above it concerning one of Pools is not in it yet (see Build).
	Built int64
	// Pools are the pools the edge has cells in, by name.
	Pools []string
}

// EdgeStates returns the states of edges changed after generation since
// (all of them for 0), the ids of edges deleted since, and the generation
// they are current to. The counter is read first: a writer holds it until
// it commits, so every change up to it is visible to the queries that
// follow.
func (s *Store) EdgeStates(ctx context.Context, since int64) (states []EdgeState, deleted []string, gen int64, err error) {
	gen, err = s.Generation(ctx)
	if err != nil || gen == since {
		return nil, nil, gen, err
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT e.id, e.cert_serial, e.sequence, e.gen, e.built,
		(SELECT COUNT(*) FROM tasks t WHERE t.edge_id = e.id AND t.state = 'pending')
		FROM edges e WHERE e.gen > ?`), since)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("edge states: %w", err)
	}
	defer rows.Close()
	byID := map[string]int{}
	for rows.Next() {
		var st EdgeState
		if err := rows.Scan(&st.ID, &st.CertSerial, &st.Sequence, &st.Gen, &st.Built, &st.PendingTasks); err != nil {
			return nil, nil, 0, fmt.Errorf("edge states: %w", err)
		}
		byID[st.ID] = len(states)
		states = append(states, st)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, 0, fmt.Errorf("edge states: %w", err)
	}
	// Their pools: an assignment's change bumps the edge's generation.
	pools, err := s.db.QueryContext(ctx, s.q(`SELECT DISTINCT a.edge_id, a.pool FROM assignments a JOIN edges e ON e.id = a.edge_id
		WHERE e.gen > ? ORDER BY a.edge_id, a.pool`), since)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("edge pools: %w", err)
	}
	defer pools.Close()
	for pools.Next() {
		var id, pool string
		if err := pools.Scan(&id, &pool); err != nil {
			return nil, nil, 0, fmt.Errorf("edge pools: %w", err)
		}
		if i, ok := byID[id]; ok {
			states[i].Pools = append(states[i].Pools, pool)
		}
	}
	if err := pools.Err(); err != nil {
		return nil, nil, 0, fmt.Errorf("edge pools: %w", err)
	}
	del, err := s.db.QueryContext(ctx, s.q(`SELECT id FROM deleted_edges WHERE gen > ?`), since)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("deleted edges: %w", err)
	}
	defer del.Close()
	for del.Next() {
		var id string
		if err := del.Scan(&id); err != nil {
			return nil, nil, 0, fmt.Errorf("deleted edges: %w", err)
		}
		deleted = append(deleted, id)
	}
	return states, deleted, gen, del.Err()
}

// DeleteEdge removes an edge with everything of its own (assignments,
// manifests, acks, tasks) and ends its egress leases: its certificate is
// refused from then on, and its name may be used again.
func (s *Store) DeleteEdge(ctx context.Context, id string) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM edges WHERE id = ?`), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("edge %s: %w", id, ErrNotFound)
		}
		if _, err = tx.ExecContext(ctx, s.q(`INSERT INTO deleted_edges (id, gen) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET gen = excluded.gen`), id, gen); err != nil {
			return err
		}
		return s.endLeases(ctx, tx, id)
	})
	if err != nil {
		return fmt.Errorf("delete edge %s: %w", id, err)
	}
	return nil
}

// Generation is the current change generation of edges.
func (s *Store) Generation(ctx context.Context) (int64, error) {
	var gen int64
	if err := s.db.QueryRowContext(ctx, `SELECT value FROM counters WHERE name = 'gen'`).Scan(&gen); err != nil {
		return 0, fmt.Errorf("edge generation: %w", err)
	}
	return gen, nil
}

// Assignments returns an edge's cell → pool assignments.
func (s *Store) Assignments(ctx context.Context, edgeID string) (map[string]string, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT cell, pool FROM assignments WHERE edge_id = ?`), edgeID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var c, p string
		if err := rows.Scan(&c, &p); err != nil {
			return nil, err
		}
		out[c] = p
	}
	return out, rows.Err()
}
