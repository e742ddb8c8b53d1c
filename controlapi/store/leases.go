package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Lease is an egress lease: Holder owns (Org, Class) at Epoch until
// ExpiresAt, unless it renews.
type Lease struct {
	Org, Class string
	Holder     string
	Epoch      int64
	AcquiredAt time.Time
	RenewedAt  time.Time
	ExpiresAt  time.Time
}

// Superseded names a live holder's lease that an acquisition may end
// (the election moved ownership away from it).
type Superseded struct {
	Holder string
	Epoch  int64
}

const leaseColumns = `org, class, holder, epoch, acquired_at, renewed_at, expires_at`

func scanLease(r scanner) (Lease, error) {
	var l Lease
	var acq, ren, exp int64
	err := r.Scan(&l.Org, &l.Class, &l.Holder, &l.Epoch, &acq, &ren, &exp)
	l.AcquiredAt, l.RenewedAt, l.ExpiresAt = fromMS(acq), fromMS(ren), fromMS(exp)
	return l, err
}

// ActiveLease returns the scope's active lease, which may have expired
// (the next acquisition ends it), or ErrNotFound.
func (s *Store) ActiveLease(ctx context.Context, org, class string) (Lease, error) {
	l, err := scanLease(s.db.QueryRowContext(ctx, s.q(`SELECT `+leaseColumns+` FROM egress_leases WHERE org = ? AND class = ? AND active = 1`), org, class))
	if errors.Is(err, sql.ErrNoRows) {
		return Lease{}, fmt.Errorf("lease %s/%s: %w", org, class, ErrNotFound)
	}
	return l, err
}

// ActiveLeases lists the active leases of org (every org's for ""), by
// org and class, expired ones included.
func (s *Store) ActiveLeases(ctx context.Context, org string) ([]Lease, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+leaseColumns+` FROM egress_leases WHERE active = 1 AND (? = '' OR org = ?) ORDER BY org, class`), org, org)
	if err != nil {
		return nil, fmt.Errorf("leases: %w", err)
	}
	defer rows.Close()
	var out []Lease
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, fmt.Errorf("leases: %w", err)
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// AcquireLease makes holder the scope's lease holder until now+ttl with a
// new epoch: an expired active lease (and sup's, when given and still
// active at its epoch) is ended first; a lease still active after that
// fails the insert on the partial unique index, and the caller lost the
// race (ErrLeaseHeld). Epochs come from a counter per scope that only
// grows; ended lease rows are pruned.
func (s *Store) AcquireLease(ctx context.Context, org, class, holder string, now time.Time, ttl time.Duration, sup *Superseded) (Lease, error) {
	l := Lease{Org: org, Class: class, Holder: holder, AcquiredAt: now.UTC().Truncate(time.Millisecond)}
	l.RenewedAt, l.ExpiresAt = l.AcquiredAt, l.AcquiredAt.Add(ttl)
	err := s.tx(ctx, func(tx *sql.Tx) error {
		supHolder, supEpoch := "", int64(-1)
		if sup != nil {
			supHolder, supEpoch = sup.Holder, sup.Epoch
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE egress_leases SET active = 0, ended_at = ? WHERE org = ? AND class = ? AND active = 1
			AND (expires_at <= ? OR (holder = ? AND epoch = ?))`), ms(now), org, class, ms(now), supHolder, supEpoch); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM egress_leases WHERE org = ? AND class = ? AND active = 0`), org, class); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, s.q(`INSERT INTO egress_epochs (org, class, epoch) VALUES (?, ?, 1)
			ON CONFLICT (org, class) DO UPDATE SET epoch = egress_epochs.epoch + 1 RETURNING epoch`), org, class).Scan(&l.Epoch); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO egress_leases (org, class, epoch, holder, active, acquired_at, renewed_at, expires_at)
			VALUES (?, ?, ?, ?, 1, ?, ?, ?)`), org, class, l.Epoch, holder, ms(l.AcquiredAt), ms(l.RenewedAt), ms(l.ExpiresAt))
		if isUnique(err) {
			return ErrLeaseHeld
		}
		return err
	})
	if err != nil {
		return Lease{}, fmt.Errorf("acquire lease %s/%s for %s: %w", org, class, holder, err)
	}
	return l, nil
}

// RenewLease extends holder's current lease at epoch to now+ttl; a lease
// expired, superseded or released is not renewed (ErrLeaseLost): its
// holder must acquire again, with a new epoch.
func (s *Store) RenewLease(ctx context.Context, org, class, holder string, epoch int64, now time.Time, ttl time.Duration) (Lease, error) {
	now = now.UTC().Truncate(time.Millisecond)
	res, err := s.execLocked(ctx, s.q(`UPDATE egress_leases SET renewed_at = ?, expires_at = ? WHERE org = ? AND class = ? AND holder = ?
		AND epoch = ? AND active = 1 AND expires_at > ?`), ms(now), ms(now.Add(ttl)), org, class, holder, epoch, ms(now))
	if err != nil {
		return Lease{}, fmt.Errorf("renew lease %s/%s for %s: %w", org, class, holder, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return Lease{}, fmt.Errorf("renew lease %s/%s epoch %d for %s: %w", org, class, epoch, holder, ErrLeaseLost)
	}
	l, err := s.ActiveLease(ctx, org, class)
	if err != nil {
		return Lease{}, err
	}
	if l.Holder != holder || l.Epoch != epoch {
		return Lease{}, fmt.Errorf("renew lease %s/%s epoch %d for %s: %w", org, class, epoch, holder, ErrLeaseLost)
	}
	return l, nil
}

// ReleaseLease ends holder's lease at epoch (ErrLeaseLost when it is not
// active any more).
func (s *Store) ReleaseLease(ctx context.Context, org, class, holder string, epoch int64, now time.Time) error {
	res, err := s.execLocked(ctx, s.q(`UPDATE egress_leases SET active = 0, ended_at = ? WHERE org = ? AND class = ? AND holder = ?
		AND epoch = ? AND active = 1`), ms(now), org, class, holder, epoch)
	if err != nil {
		return fmt.Errorf("release lease %s/%s for %s: %w", org, class, holder, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("release lease %s/%s epoch %d for %s: %w", org, class, epoch, holder, ErrLeaseLost)
	}
	return nil
}
