package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"cellvisor/manifest"
)

// Certificate is an uploaded HTTPS certificate: its chain and what may be
// shown of it. Its private key stays in the store, encrypted at rest
// (certificate_keys), and leaves it only sealed to an edge (KeySealer).
type Certificate struct {
	Name        string
	Fingerprint string // hex SHA-256 of the leaf's DER
	Chain       string // PEM, leaf first
	Names       []string
	Issuer      string
	KeyType     string
	NotBefore   time.Time
	NotAfter    time.Time
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// UsedBy are the domains whose current revision names it (filled by
	// Certificate and Certificates).
	UsedBy []string
}

// KeySealer seals a certificate's key, which the store holds encrypted at
// rest as keyAtRest, to an edge's encryption public key (encKey, as the
// edge registered it) for one domain and certificate fingerprint. The
// control API sets Store.SealKey; nil gives entries no key.
type KeySealer func(edgeID, domain, fingerprint, encKey, keyAtRest string) (*manifest.SealedKey, error)

const certColumns = `name, fingerprint, chain, names, issuer, key_type, not_before, not_after, created_at, updated_at`

func scanCert(r scanner) (Certificate, error) {
	var c Certificate
	var names string
	var nb, na, ca, ua int64
	err := r.Scan(&c.Name, &c.Fingerprint, &c.Chain, &names, &c.Issuer, &c.KeyType, &nb, &na, &ca, &ua)
	if names != "" {
		c.Names = strings.Split(names, ",")
	}
	c.NotBefore, c.NotAfter, c.CreatedAt, c.UpdatedAt = fromMS(nb), fromMS(na), fromMS(ca), fromMS(ua)
	return c, err
}

// PutCertificate stores c under c.Name with its key encrypted at rest
// (keyAtRest). Without replace, a name already taken is refused
// (ErrConflict); with it, the certificate is stored or replaced (an
// issuer renewing one uses it too). It returns the domains whose current
// revision names it, which the caller republishes with the new chain.
// The key a replaced certificate had stays (by fingerprint) for the
// revisions that name it.
func (s *Store) PutCertificate(ctx context.Context, c Certificate, keyAtRest string, replace bool) ([]string, error) {
	var used []string
	err := s.tx(ctx, func(tx *sql.Tx) error {
		now := ms(s.Now())
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO certificate_keys (fingerprint, key_sealed, created_at) VALUES (?, ?, ?)
			ON CONFLICT (fingerprint) DO UPDATE SET key_sealed = excluded.key_sealed`), c.Fingerprint, keyAtRest, now); err != nil {
			return fmt.Errorf("store key: %w", err)
		}
		set := ` ON CONFLICT (name) DO NOTHING`
		if replace {
			set = ` ON CONFLICT (name) DO UPDATE SET fingerprint = excluded.fingerprint, chain = excluded.chain, names = excluded.names,
				issuer = excluded.issuer, key_type = excluded.key_type, not_before = excluded.not_before, not_after = excluded.not_after,
				updated_at = excluded.updated_at`
		}
		res, err := tx.ExecContext(ctx, s.q(`INSERT INTO certificates (`+certColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`+set),
			c.Name, c.Fingerprint, c.Chain, strings.Join(c.Names, ","), c.Issuer, c.KeyType, ms(c.NotBefore), ms(c.NotAfter), now, now)
		if err != nil {
			return fmt.Errorf("store certificate: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("certificate %s exists: replace it with --replace: %w", c.Name, ErrConflict)
		}
		used, err = s.certUsers(ctx, tx, c.Name)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("put certificate %s: %w", c.Name, err)
	}
	return used, nil
}

// certUsers are the domains whose current revision names certificate
// name.
func (s *Store) certUsers(ctx context.Context, q querier, name string) ([]string, error) {
	return s.strings(ctx, q, `SELECT d.name FROM domains d JOIN domain_revisions r ON r.domain = d.name AND r.revision = d.revision
		WHERE d.deleted = 0 AND r.certificate = ? ORDER BY d.name`, name)
}

// Certificate returns one certificate, or ErrNotFound.
func (s *Store) Certificate(ctx context.Context, name string) (Certificate, error) {
	c, err := scanCert(s.db.QueryRowContext(ctx, s.q(`SELECT `+certColumns+` FROM certificates WHERE name = ?`), name))
	if errors.Is(err, sql.ErrNoRows) {
		return Certificate{}, fmt.Errorf("certificate %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Certificate{}, err
	}
	c.UsedBy, err = s.certUsers(ctx, s.db, name)
	return c, err
}

// Certificates returns every certificate, by name.
func (s *Store) Certificates(ctx context.Context) ([]Certificate, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+certColumns+` FROM certificates ORDER BY name`)
	if err != nil {
		return nil, err
	}
	var out []Certificate
	for rows.Next() {
		c, err := scanCert(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		if out[i].UsedBy, err = s.certUsers(ctx, s.db, out[i].Name); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// DeleteCertificate removes a certificate and its key (unless another
// certificate has the same leaf). It is refused with ErrConflict, naming
// them, while domains' current revisions name it; ErrNotFound when none.
func (s *Store) DeleteCertificate(ctx context.Context, name string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var fp string
		err := tx.QueryRowContext(ctx, s.q(`SELECT fingerprint FROM certificates WHERE name = ?`), name).Scan(&fp)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("certificate %s: %w", name, ErrNotFound)
		}
		if err != nil {
			return err
		}
		used, err := s.certUsers(ctx, tx, name)
		if err != nil {
			return err
		}
		if len(used) > 0 {
			return fmt.Errorf("certificate %s is used by %s: publish them with another certificate, or delete them, first: %w", name, strings.Join(used, ", "), ErrConflict)
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM certificates WHERE name = ?`), name); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, s.q(`DELETE FROM certificate_keys WHERE fingerprint = ? AND NOT EXISTS (SELECT 1 FROM certificates WHERE fingerprint = ?)`), fp, fp)
		return err
	})
}

// revisionTLS reads the certificate an artifact names and the fingerprint
// of the chain it carries ("" for none).
func revisionTLS(artifact []byte) (name, fingerprint string) {
	var d struct {
		TLS *struct {
			Certificate string `json:"certificate"`
			Fingerprint string `json:"fingerprint"`
		} `json:"tls"`
	}
	if json.Unmarshal(artifact, &d) != nil || d.TLS == nil {
		return "", ""
	}
	return d.TLS.Certificate, d.TLS.Fingerprint
}

// sealFor seals the key of the certificate with fingerprint fp to an
// edge for domain: nil when there is nothing to seal (no fingerprint, no
// sealer, no encryption key registered by the edge, or no key held for
// that certificate any longer), which gives the entry no key. Without
// seal it only names the key it would seal to (KeyID), sealing nothing.
func (s *Store) sealFor(ctx context.Context, tx *sql.Tx, edgeID, domain, fp string, seal bool) (*manifest.SealedKey, error) {
	if fp == "" || s.SealKey == nil {
		return nil, nil
	}
	var enc string
	if err := tx.QueryRowContext(ctx, s.q(`SELECT enc_key FROM edges WHERE id = ?`), edgeID).Scan(&enc); err != nil {
		return nil, fmt.Errorf("encryption key of edge %s: %w", edgeID, err)
	}
	if enc == "" {
		return nil, nil
	}
	var atRest string
	err := tx.QueryRowContext(ctx, s.q(`SELECT key_sealed FROM certificate_keys WHERE fingerprint = ?`), fp).Scan(&atRest)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("key of certificate %s: %w", fp, err)
	}
	if !seal {
		return &manifest.SealedKey{KeyID: encKeyID(enc)}, nil
	}
	k, err := s.SealKey(edgeID, domain, fp, enc, atRest)
	if err != nil {
		return nil, fmt.Errorf("seal the key of %s to edge %s: %w", domain, edgeID, err)
	}
	return k, nil
}

// SetEncryptionKey records an edge's encryption public key (enc, as
// tlsseal.EncodePublic writes it; "" forgets it). When it changes and the
// edge has entries with a certificate, the edge gets a new sequence with
// their keys sealed to it (advanced reports it).
func (s *Store) SetEncryptionKey(ctx context.Context, edgeID, enc string, sign Signer) (seq EdgeSequence, advanced bool, err error) {
	err = s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		var old string
		err = tx.QueryRowContext(ctx, s.q(`SELECT enc_key FROM edges WHERE id = ?`), edgeID).Scan(&old)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("edge %s: %w", edgeID, ErrNotFound)
		}
		if err != nil || old == enc {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE edges SET enc_key = ?, gen = ? WHERE id = ?`), enc, gen, edgeID); err != nil {
			return err
		}
		domains, err := s.strings(ctx, tx, `SELECT m.domain FROM manifest_entries m
			JOIN domains d ON d.name = m.domain JOIN domain_revisions r ON r.domain = d.name AND r.revision = m.revision
			WHERE m.edge_id = ? AND m.to_seq = 0 AND r.fingerprint <> '' ORDER BY m.domain`, edgeID)
		if err != nil || len(domains) == 0 {
			return err
		}
		seq, err = s.reemitEdge(ctx, tx, gen, edgeID, domains, sign)
		advanced = err == nil
		return err
	})
	if err != nil {
		return EdgeSequence{}, false, fmt.Errorf("set the encryption key of edge %s: %w", edgeID, err)
	}
	return seq, advanced, nil
}

// EncryptionKey returns an edge's registered encryption public key ("" for
// none), or ErrNotFound.
func (s *Store) EncryptionKey(ctx context.Context, edgeID string) (string, error) {
	var enc string
	err := s.db.QueryRowContext(ctx, s.q(`SELECT enc_key FROM edges WHERE id = ?`), edgeID).Scan(&enc)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("edge %s: %w", edgeID, ErrNotFound)
	}
	return enc, err
}

// HasCertificateKey reports whether the store holds the key of the
// certificate whose leaf has fingerprint fp.
func (s *Store) HasCertificateKey(ctx context.Context, fp string) (bool, error) {
	var n int
	err := s.db.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM certificate_keys WHERE fingerprint = ?`), fp).Scan(&n)
	return n > 0, err
}

// encKeyID is tlsseal.KeyID of an encryption key as registered (standard
// base64 of its bytes): the hex SHA-256 of the bytes.
func encKeyID(enc string) string {
	b, _ := base64.StdEncoding.DecodeString(enc)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
