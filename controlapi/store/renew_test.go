package store

import (
	"errors"
	"testing"
	"time"
)

func TestTokenExpiryIsStoredAndRotated(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		exp := time.UnixMilli(1_900_000_000_123).UTC()
		e, err := s.CreateEdge(ctx(t), NewEdge{ID: "id-x", Name: "x", Slots: 1, TokenHash: "tok-x", TokenExpiresAt: exp}, fakeSign)
		if err != nil {
			t.Fatal(err)
		}
		if !e.TokenExpiresAt.Equal(exp) {
			t.Fatalf("created: token expires %v, want %v", e.TokenExpiresAt, exp)
		}
		if got, err := s.EdgeByToken(ctx(t), "tok-x"); err != nil || !got.TokenExpiresAt.Equal(exp) {
			t.Fatalf("by token: expires %v, %v", got.TokenExpiresAt, err)
		}
		exp2 := exp.Add(48 * time.Hour)
		if err := s.Rotate(ctx(t), e.ID, "tok-y", exp2); err != nil {
			t.Fatal(err)
		}
		if got, err := s.EdgeByToken(ctx(t), "tok-y"); err != nil || !got.TokenExpiresAt.Equal(exp2) {
			t.Fatalf("rotated token expires %v, %v; want %v", got.TokenExpiresAt, err, exp2)
		}
	})
}

func TestPendingCertificateIsPromotedOnceAndRotationDropsIt(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "fra-1")
		if err := s.SetPending(ctx(t), e.ID, "", "csr", "PEM", "s2"); !errors.Is(err, ErrConflict) {
			t.Fatalf("renewal of an edge never enrolled: %v, want ErrConflict", err)
		}
		if err := s.Enroll(ctx(t), e.ID, "tok-fra-1", "csr1", "PEM1", "s1"); err != nil {
			t.Fatal(err)
		}
		if err := s.SetPending(ctx(t), e.ID, "s0", "csr2", "PEM2", "s2"); !errors.Is(err, ErrConflict) {
			t.Fatalf("renewal authenticated by a certificate not current: %v, want ErrConflict", err)
		}
		if err := s.SetPending(ctx(t), e.ID, "s1", "csr2", "PEM2", "s2"); err != nil {
			t.Fatal(err)
		}
		got, _ := s.Edge(ctx(t), e.ID)
		if got.CertSerial != "s1" || got.PendingSerial != "s2" || got.PendingCSRHash != "csr2" || got.PendingCertPEM != "PEM2" {
			t.Fatalf("after renewal: %+v", got)
		}
		// Another CSR replaces the pending certificate.
		if err := s.SetPending(ctx(t), e.ID, "s1", "csr3", "PEM3", "s3"); err != nil {
			t.Fatal(err)
		}
		if err := s.PromotePending(ctx(t), e.ID, "s2"); !errors.Is(err, ErrConflict) {
			t.Fatalf("promote a replaced pending certificate: %v, want ErrConflict", err)
		}
		gen, _ := s.Generation(ctx(t))
		if err := s.PromotePending(ctx(t), e.ID, "s3"); err != nil {
			t.Fatal(err)
		}
		got, _ = s.Edge(ctx(t), e.ID)
		if got.CertSerial != "s3" || got.CertPEM != "PEM3" || got.PendingSerial != "" || got.PendingCertPEM != "" || got.PendingCSRHash != "" || got.CSRHash != "csr1" {
			t.Fatalf("after promotion: %+v", got)
		}
		states, _, _, err := s.EdgeStates(ctx(t), gen)
		if err != nil || len(states) != 1 || states[0].CertSerial != "s3" {
			t.Fatalf("poll cache view after promotion: %+v, %v", states, err)
		}
		if err := s.PromotePending(ctx(t), e.ID, "s3"); !errors.Is(err, ErrConflict) {
			t.Fatalf("second promotion: %v, want ErrConflict", err)
		}
		if err := s.SetPending(ctx(t), e.ID, "s3", "csr4", "PEM4", "s4"); err != nil {
			t.Fatal(err)
		}
		if err := s.Rotate(ctx(t), e.ID, "tok2", time.Time{}); err != nil {
			t.Fatal(err)
		}
		got, _ = s.Edge(ctx(t), e.ID)
		if got.Enrolled() || got.PendingSerial != "" || got.PendingCertPEM != "" {
			t.Fatalf("after rotation: %+v", got)
		}
		if err := s.PromotePending(ctx(t), e.ID, "s4"); !errors.Is(err, ErrConflict) {
			t.Fatalf("promote a pending certificate rotated away: %v, want ErrConflict", err)
		}
	})
}

// Migration 5 gives tokens issued before it a day from the upgrade.
func TestMigrationGivesOldTokensADay(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "fra-1") // no expiry
		if _, err := s.db.ExecContext(ctx(t), `DELETE FROM schema_migrations WHERE version = 5`); err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{"token_expires_at", "pending_csr_hash", "pending_cert_pem", "pending_serial"} {
			if _, err := s.db.ExecContext(ctx(t), `ALTER TABLE edges DROP COLUMN `+c); err != nil {
				t.Fatal(err)
			}
		}
		now := time.UnixMilli(1_800_000_000_000).UTC()
		s.Now = func() time.Time { return now }
		if err := s.migrate(ctx(t)); err != nil {
			t.Fatal(err)
		}
		got, err := s.Edge(ctx(t), e.ID)
		if err != nil || !got.TokenExpiresAt.Equal(now.Add(24*time.Hour)) {
			t.Fatalf("token expires %v, %v; want %v", got.TokenExpiresAt, err, now.Add(24*time.Hour))
		}
	})
}
