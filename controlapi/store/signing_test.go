package store

import (
	"crypto/ed25519"
	"errors"
	"testing"

	"cellvisor/manifest"
)

// Every sequence gets a header signed over exactly its entries; a rollback
// republishes an old revision marked rollback; a key rotation re-signs
// every edge's manifest with the new key and carries the chain.
func TestHeadersRollbackRotation(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		pub := testKey.Public().(ed25519.PublicKey)
		manifestAt := func(seq int64) manifest.Manifest {
			t.Helper()
			es, err := s.Entries(ctx(t), a.ID, seq, "", 500)
			if err != nil {
				t.Fatal(err)
			}
			h, sig, assign, err := s.HeaderAssignments(ctx(t), a.ID, seq)
			if err != nil {
				t.Fatal(err)
			}
			return manifest.Manifest{EdgeID: a.ID, Sequence: seq, Entries: es, Header: h, HeaderSignature: sig, Assignments: assign}
		}
		for _, body := range []string{`{"v":1}`, `{"v":2}`} {
			if _, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte(body)), fakeSign); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := manifestAt(2).VerifyHeader(pub, a.ID); err != nil {
			t.Fatalf("sequence 2: %v", err)
		}
		rb, err := s.RollbackDomain(ctx(t), "x.example", 1, nil, fakeSign)
		if err != nil || rb.Domain.Revision != 1 || len(rb.Edges) != 1 {
			t.Fatalf("rollback: %+v, %v", rb, err)
		}
		m := manifestAt(3)
		if _, err := m.VerifyHeader(pub, a.ID); err != nil || len(m.Entries) != 1 || !m.Entries[0].Rollback || m.Entries[0].Revision != 1 || !signedFor(a.ID, m.Entries[0]) {
			t.Fatalf("after rollback: %+v, %v", m.Entries, err)
		}
		if _, err := s.RollbackDomain(ctx(t), "x.example", 2, nil, fakeSign); !errors.Is(err, ErrConflict) {
			t.Errorf("rollback upwards: %v", err)
		}
		if p, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte(`{"v":3}`)), fakeSign); err != nil || p.Domain.Revision != 3 {
			t.Fatalf("publish after rollback: %+v, %v", p, err)
		}
		seed := make([]byte, ed25519.SeedSize)
		seed[0] = 1
		next := ed25519.NewKeyFromSeed(seed)
		open := func(sealed string) (ed25519.PrivateKey, error) {
			if sealed == "next-key" {
				return next, nil
			}
			return fakeSign(sealed)
		}
		rot, err := s.RotateKey(ctx(t), open, next, "next-key")
		if err != nil || len(rot.Edges) != 1 || rot.Edges[0].Sequence != 5 {
			t.Fatalf("rotate: %+v, %v", rot, err)
		}
		m = manifestAt(5)
		signer, err := m.VerifyHeader(pub, a.ID)
		if err != nil || !signer.Equal(next.Public()) || signer.Equal(pub) || len(m.Entries) != 1 || m.Entries[0].Revision != 3 {
			t.Fatalf("after rotation: %+v, %v", m.Entries, err)
		}
		if err := m.Entries[0].Verify(next.Public().(ed25519.PublicKey), a.ID, []byte(`{"v":3}`)); err != nil {
			t.Errorf("entry not re-signed by the new key: %v", err)
		}
		if _, err := s.PublishDomain(ctx(t), "y.example", "shared-default", nil, bytes([]byte(`{"y":1}`)), open); err != nil {
			t.Fatal(err)
		}
		if m := manifestAt(6); len(m.Header.Rotations) != 1 {
			t.Errorf("header after rotation carries %d rotations, want the chain of 1", len(m.Header.Rotations))
		} else if signer, err := m.VerifyHeader(pub, a.ID); err != nil || !signer.Equal(next.Public()) {
			t.Errorf("sequence 6 from the old pin: %v", err)
		}
	})
}
