package store

import (
	"context"
	"database/sql"
	"fmt"
)

// SetPending records a renewed certificate for an edge, issued for the CSR
// that hashes to csrHash, beside its current one, which stays valid until
// the edge uses the new one (PromotePending). A pending certificate already
// there is replaced: the edge asked again with another key, and the one it
// replaces was never used. It fails with ErrConflict unless currentSerial
// is still the edge's current certificate (rotated, or renewed through
// another replica meanwhile).
func (s *Store) SetPending(ctx context.Context, id, currentSerial, csrHash, certPEM, serial string) error {
	n, err := s.exec(ctx, `UPDATE edges SET pending_csr_hash = ?, pending_cert_pem = ?, pending_serial = ?
		WHERE id = ? AND cert_serial = ? AND cert_serial <> ''`, csrHash, certPEM, serial, id, currentSerial)
	if err != nil {
		return fmt.Errorf("renew edge %s: %w", id, err)
	}
	if n != 1 {
		return fmt.Errorf("renew edge %s: certificate %s is not current: %w", id, currentSerial, ErrConflict)
	}
	return nil
}

// PromotePending makes the edge's pending certificate, serial, its current
// one, which revokes the one it replaces. It fails with ErrConflict unless
// serial is pending (promoted by a concurrent request, replaced, or
// rotated away): the caller reads the edge again to tell which.
func (s *Store) PromotePending(ctx context.Context, id, serial string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		gen, err := s.next(ctx, tx, "gen")
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.q(`UPDATE edges SET cert_pem = pending_cert_pem, cert_serial = pending_serial,
			pending_csr_hash = '', pending_cert_pem = '', pending_serial = '', gen = ?
			WHERE id = ? AND pending_serial = ? AND pending_serial <> ''`), gen, id, serial)
		if err != nil {
			return fmt.Errorf("switch edge %s to certificate %s: %w", id, serial, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("switch edge %s to certificate %s: not pending: %w", id, serial, ErrConflict)
		}
		return nil
	})
}
