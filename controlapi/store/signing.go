package store

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"cellvisor/manifest"
)

// SigningKeySetting is the setting holding the sealed current signing key.
const SigningKeySetting = "signing_key"

// Signer opens the sealed signing key the store holds (see
// SigningKeySetting). Every write that signs reads the current key inside
// its transaction, after the generation counter that a key rotation takes
// too, so that every replica signs with the key rotated to the moment it
// commits, never with one it loaded at start.
type Signer func(sealed string) (ed25519.PrivateKey, error)

// keyring is the key a transaction signs with and the rotation chain that
// leads to it.
type keyring struct {
	priv      ed25519.PrivateKey
	rotations []manifest.Rotation
}

func (s *Store) keyring(ctx context.Context, tx *sql.Tx, open Signer) (keyring, error) {
	var sealed string
	err := tx.QueryRowContext(ctx, s.q(`SELECT value FROM settings WHERE name = ?`), SigningKeySetting).Scan(&sealed)
	if err != nil {
		return keyring{}, fmt.Errorf("signing key: %w", err)
	}
	priv, err := open(sealed)
	if err != nil {
		return keyring{}, fmt.Errorf("signing key: %w", err)
	}
	k := keyring{priv: priv}
	rows, err := tx.QueryContext(ctx, `SELECT rotation FROM key_rotations ORDER BY id`)
	if err != nil {
		return keyring{}, fmt.Errorf("key rotations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var doc string
		var r manifest.Rotation
		if err := rows.Scan(&doc); err != nil {
			return keyring{}, err
		}
		if err := json.Unmarshal([]byte(doc), &r); err != nil {
			return keyring{}, fmt.Errorf("key rotation: %w", err)
		}
		k.rotations = append(k.rotations, r)
	}
	return k, rows.Err()
}

// entry signs an entry for an edge.
func (k keyring) entry(edgeID string, e manifest.Entry) manifest.Entry {
	e.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(k.priv, manifest.SigningMessage(edgeID, e)))
	return e
}

// signHeader signs the header of an edge's manifest at seq, from the
// entries tx sees, and stores it.
func (s *Store) signHeader(ctx context.Context, tx *sql.Tx, k keyring, edgeID string, seq int64) error {
	if seq > manifest.MaxSequence {
		return fmt.Errorf("edge %s: sequence %d over %d", edgeID, seq, int64(manifest.MaxSequence))
	}
	entries, err := s.entriesAt(ctx, tx, edgeID, seq)
	if err != nil {
		return err
	}
	assign, err := s.assignmentsAt(ctx, tx, edgeID)
	if err != nil {
		return err
	}
	m := manifest.Sign(k.priv, manifest.Manifest{EdgeID: edgeID, Sequence: seq, Entries: entries, Assignments: assign}, k.rotations)
	doc, err := json.Marshal(m.Header)
	if err != nil {
		return err
	}
	adoc, err := json.Marshal(assign)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, s.q(`INSERT INTO manifest_headers (edge_id, sequence, header, signature, assignments) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (edge_id, sequence) DO UPDATE SET header = excluded.header, signature = excluded.signature, assignments = excluded.assignments`),
		edgeID, seq, string(doc), m.HeaderSignature, string(adoc))
	if err != nil {
		return fmt.Errorf("store header of edge %s sequence %d: %w", edgeID, seq, err)
	}
	_, err = tx.ExecContext(ctx, s.q(`DELETE FROM manifest_headers WHERE edge_id = ? AND sequence <= ?`), edgeID, seq-keepSequences)
	return err
}

// entriesAt reads every entry of an edge's manifest at seq, by domain.
func (s *Store) entriesAt(ctx context.Context, q querier, edgeID string, seq int64) ([]manifest.Entry, error) {
	rows, err := q.QueryContext(ctx, s.q(`SELECT `+entryColumns+` FROM manifest_entries
		WHERE edge_id = ? AND from_seq <= ? AND (to_seq = 0 OR to_seq > ?) ORDER BY domain`), edgeID, seq, seq)
	if err != nil {
		return nil, err
	}
	return scanEntries(rows)
}

// entryColumns are the manifest_entries columns scanEntry reads, in order.
const entryColumns = `domain, pool, revision, size, sha256, rollback, signature, cells, sealed_key`

// scanEntries reads every row of rows (entryColumns) and closes them.
func scanEntries(rows *sql.Rows) ([]manifest.Entry, error) {
	defer rows.Close()
	var out []manifest.Entry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

type querier interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

func scanEntry(r scanner) (manifest.Entry, error) {
	var e manifest.Entry
	var rollback int
	var cells, key string
	err := r.Scan(&e.Domain, &e.Pool, &e.Revision, &e.Size, &e.SHA256, &rollback, &e.Signature, &cells, &key)
	e.Rollback = rollback != 0
	if cells != "" {
		e.Cells = strings.Split(cells, ",")
	}
	if err == nil && key != "" {
		e.Key = new(manifest.SealedKey)
		if jerr := json.Unmarshal([]byte(key), e.Key); jerr != nil {
			return e, fmt.Errorf("sealed key of entry %s: %w", e.Domain, jerr)
		}
	}
	return e, err
}

// Header returns the signed header of an edge's manifest at seq, or
// ErrNotFound.
func (s *Store) Header(ctx context.Context, edgeID string, seq int64) (manifest.Header, string, error) {
	h, sig, _, err := s.HeaderAssignments(ctx, edgeID, seq)
	return h, sig, err
}

// HeaderAssignments returns the signed header of an edge's manifest at
// seq and the cell assignments it signs (nil for a header signed before
// assignments were), or ErrNotFound.
func (s *Store) HeaderAssignments(ctx context.Context, edgeID string, seq int64) (manifest.Header, string, *manifest.Assignments, error) {
	var doc, sig, adoc string
	err := s.db.QueryRowContext(ctx, s.q(`SELECT header, signature, assignments FROM manifest_headers WHERE edge_id = ? AND sequence = ?`), edgeID, seq).Scan(&doc, &sig, &adoc)
	if errors.Is(err, sql.ErrNoRows) {
		return manifest.Header{}, "", nil, fmt.Errorf("header of edge %s sequence %d: %w", edgeID, seq, ErrNotFound)
	}
	if err != nil {
		return manifest.Header{}, "", nil, err
	}
	var h manifest.Header
	if err := json.Unmarshal([]byte(doc), &h); err != nil {
		return manifest.Header{}, "", nil, fmt.Errorf("header of edge %s sequence %d: %w", edgeID, seq, err)
	}
	var a *manifest.Assignments
	if adoc != "" && adoc != "null" {
		a = new(manifest.Assignments)
		if err := json.Unmarshal([]byte(adoc), a); err != nil {
			return manifest.Header{}, "", nil, fmt.Errorf("assignments of edge %s sequence %d: %w", edgeID, seq, err)
		}
	}
	return h, sig, a, nil
}

// SignMissingHeaders signs the header of every edge's current manifest
// that has none (manifests written before headers existed), so that edges
// can verify them.
func (s *Store) SignMissingHeaders(ctx context.Context, open Signer) (int, error) {
	n := 0
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := s.next(ctx, tx, "gen"); err != nil { // orders it with every signing write
			return err
		}
		k, err := s.keyring(ctx, tx, open)
		if err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT e.id, e.sequence FROM edges e WHERE e.sequence > 0
			AND NOT EXISTS (SELECT 1 FROM manifest_headers h WHERE h.edge_id = e.id AND h.sequence = e.sequence) ORDER BY e.id`)
		if err != nil {
			return err
		}
		type es struct {
			id  string
			seq int64
		}
		var todo []es
		for rows.Next() {
			var e es
			if err := rows.Scan(&e.id, &e.seq); err != nil {
				rows.Close()
				return err
			}
			todo = append(todo, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, e := range todo {
			if err := s.signHeader(ctx, tx, k, e.id, e.seq); err != nil {
				return err
			}
		}
		n = len(todo)
		return nil
	})
	return n, err
}

// FirstManifests gives every edge still at sequence 0 (created by a
// control API that gave a manifest only to an edge whose pools held
// domains) its first manifest: sequence 1, empty, its header signed with
// the edge's assignments. It returns how many it gave one.
func (s *Store) FirstManifests(ctx context.Context, open Signer) (int, error) {
	n := 0
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen") // orders it with every signing write
		if err != nil {
			return err
		}
		ids, err := s.strings(ctx, tx, `SELECT id FROM edges WHERE sequence = 0 ORDER BY id`)
		if err != nil {
			return err
		}
		for _, id := range ids { // in id order: see Touch
			if _, err := s.reemitEdge(ctx, tx, gen, id, nil, open); err != nil {
				return err
			}
		}
		n = len(ids)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("first manifests: %w", err)
	}
	return n, nil
}

// Rotated is the outcome of a key rotation.
type Rotated struct {
	Rotation manifest.Rotation
	Edges    []EdgeSequence
}

// RotateKey replaces the signing key by next (sealed as nextSealed): it
// records the rotation signed by the old key and the new one, and gives
// every edge with a manifest a new sequence whose entries and header are
// signed by the new key and announce the rotation. Headers carry the whole
// chain from then on, so that an edge that missed any number of rotations
// follows them.
func (s *Store) RotateKey(ctx context.Context, open Signer, next ed25519.PrivateKey, nextSealed string) (Rotated, error) {
	var out Rotated
	err := s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		old, err := s.keyring(ctx, tx, open)
		if err != nil {
			return err
		}
		if len(old.rotations) >= manifest.MaxRotations {
			return fmt.Errorf("%d key rotations already, at most %d: %w", len(old.rotations), manifest.MaxRotations, ErrConflict)
		}
		out.Rotation = manifest.NewRotation(old.priv, next)
		doc, _ := json.Marshal(out.Rotation)
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO key_rotations (id, rotation, created_at) VALUES (?, ?, ?)`),
			len(old.rotations)+1, string(doc), ms(s.Now())); err != nil {
			return fmt.Errorf("record rotation: %w", err)
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE settings SET value = ? WHERE name = ?`), nextSealed, SigningKeySetting); err != nil {
			return err
		}
		k := keyring{priv: next, rotations: append(old.rotations, out.Rotation)}
		rows, err := tx.QueryContext(ctx, `SELECT id, sequence FROM edges WHERE sequence > 0 ORDER BY id`)
		if err != nil {
			return err
		}
		var ids []string
		for rows.Next() {
			var id string
			var seq int64
			if err := rows.Scan(&id, &seq); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range ids {
			seq, err := s.bump(ctx, tx, gen, id)
			if err != nil {
				return err
			}
			cur, err := s.entriesAt(ctx, tx, id, seq-1)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE manifest_entries SET to_seq = ? WHERE edge_id = ? AND to_seq = 0`), seq, id); err != nil {
				return err
			}
			for _, e := range cur {
				if err := s.insertEntry(ctx, tx, id, seq, k.entry(id, e)); err != nil {
					return err
				}
			}
			if err := s.finishSequence(ctx, tx, k, id, seq); err != nil {
				return err
			}
			out.Edges = append(out.Edges, EdgeSequence{EdgeID: id, Sequence: seq})
		}
		return nil
	})
	if err != nil {
		return Rotated{}, fmt.Errorf("rotate signing key: %w", err)
	}
	return out, nil
}

// bump advances an edge's sequence, refusing to pass manifest.MaxSequence.
func (s *Store) bump(ctx context.Context, tx *sql.Tx, gen int64, id string) (int64, error) {
	var seq int64
	// The row lock taken here orders concurrent changes to one edge.
	err := tx.QueryRowContext(ctx, s.q(`UPDATE edges SET sequence = sequence + 1, gen = ? WHERE id = ? AND sequence < ? RETURNING sequence`),
		gen, id, int64(manifest.MaxSequence)).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("advance edge %s: sequence at its bound %d: %w", id, int64(manifest.MaxSequence), ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("advance edge %s: %w", id, err)
	}
	return seq, nil
}

// finishSequence signs the header of an edge's new sequence and prunes
// what is no longer readable.
func (s *Store) finishSequence(ctx context.Context, tx *sql.Tx, k keyring, id string, seq int64) error {
	if err := s.signHeader(ctx, tx, k, id, seq); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, s.q(`DELETE FROM manifest_entries WHERE edge_id = ? AND to_seq <> 0 AND to_seq <= ?`), id, seq-keepSequences)
	return err
}
