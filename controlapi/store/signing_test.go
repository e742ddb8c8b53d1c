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
		a := newEdge(t, s, "a") // at sequence 1, empty
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
			if _, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte(body))); err != nil {
				t.Fatal(err)
			}
			mustEdge(t, s, a.ID) // polled after each
		}
		if _, err := manifestAt(3).VerifyHeader(pub, a.ID); err != nil {
			t.Fatalf("sequence 3: %v", err)
		}
		rb, err := s.RollbackDomain(ctx(t), "x.example", 1, nil)
		if err != nil || rb.Domain.Revision != 1 || rb.Pending != 1 {
			t.Fatalf("rollback: %+v, %v", rb, err)
		}
		if got := mustEdge(t, s, a.ID).Sequence; got != 4 {
			t.Fatalf("built to sequence %d after the rollback, want 4", got)
		}
		m := manifestAt(4)
		if _, err := m.VerifyHeader(pub, a.ID); err != nil || len(m.Entries) != 1 || !m.Entries[0].Rollback || m.Entries[0].Revision != 1 || !signedFor(a.ID, m.Entries[0]) {
			t.Fatalf("after rollback: %+v, %v", m.Entries, err)
		}
		if _, err := s.RollbackDomain(ctx(t), "x.example", 2, nil); !errors.Is(err, ErrConflict) {
			t.Errorf("rollback upwards: %v", err)
		}
		if p, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte(`{"v":3}`))); err != nil || p.Domain.Revision != 3 {
			t.Fatalf("publish after rollback: %+v, %v", p, err)
		}
		mustEdge(t, s, a.ID)
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
		if err != nil || len(rot.Edges) != 1 || rot.Edges[0].Sequence != 6 {
			t.Fatalf("rotate: %+v, %v", rot, err)
		}
		m = manifestAt(6)
		signer, err := m.VerifyHeader(pub, a.ID)
		if err != nil || !signer.Equal(next.Public()) || signer.Equal(pub) || len(m.Entries) != 1 || m.Entries[0].Revision != 3 {
			t.Fatalf("after rotation: %+v, %v", m.Entries, err)
		}
		if err := m.Entries[0].Verify(next.Public().(ed25519.PublicKey), a.ID, []byte(`{"v":3}`)); err != nil {
			t.Errorf("entry not re-signed by the new key: %v", err)
		}
		if _, err := s.PublishDomain(ctx(t), "y.example", "shared-default", nil, bytes([]byte(`{"y":1}`))); err != nil {
			t.Fatal(err)
		}
		// The edge's poll builds it, signed by the new key.
		if b, err := s.Build(ctx(t), a.ID, open); err != nil || !b.Advanced || b.Sequence != 7 {
			t.Fatalf("build after the rotation: %+v, %v", b, err)
		}
		if m := manifestAt(7); len(m.Header.Rotations) != 1 {
			t.Errorf("header after rotation carries %d rotations, want the chain of 1", len(m.Header.Rotations))
		} else if signer, err := m.VerifyHeader(pub, a.ID); err != nil || !signer.Equal(next.Public()) {
			t.Errorf("sequence 7 from the old pin: %v", err)
		}
	})
}

// An edge whose pools hold no domains gets its first manifest at once: an
// empty one at sequence 1, its header signed over no entries and its cell
// assignments. An edge left at sequence 0 by an older control API gets one
// at the next start (FirstManifests), and only once.
func TestEmptyFirstManifest(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		pub := testKey.Public().(ed25519.PublicKey)
		e := newEdge(t, s, "empty")
		if e.Sequence != 1 {
			t.Fatalf("new edge whose pools hold no domains: sequence %d, want 1", e.Sequence)
		}
		verify := func(id string, seq int64) {
			t.Helper()
			es, err := s.Entries(ctx(t), id, seq, "", 500)
			if err != nil || len(es) != 0 {
				t.Fatalf("entries of %s at %d: %+v, %v", id, seq, es, err)
			}
			h, sig, assign, err := s.HeaderAssignments(ctx(t), id, seq)
			if err != nil {
				t.Fatal(err)
			}
			m := manifest.Manifest{EdgeID: id, Sequence: seq, Header: h, HeaderSignature: sig, Assignments: assign}
			if _, err := m.VerifyHeader(pub, id); err != nil {
				t.Fatalf("header of %s at %d: %v", id, seq, err)
			}
			if assign == nil || assign.Cells["cell-01"] != "shared-default" || assign.Cells["cell-02"] != "quarantine-default" {
				t.Fatalf("signed assignments of %s: %+v", id, assign)
			}
		}
		verify(e.ID, 1)

		// An edge created by an older control API: at sequence 0, no header.
		old := newEdge(t, s, "old")
		for _, q := range []string{`UPDATE edges SET sequence = 0 WHERE id = ?`, `DELETE FROM manifest_headers WHERE edge_id = ?`} {
			if _, err := s.db.ExecContext(ctx(t), s.q(q), old.ID); err != nil {
				t.Fatal(err)
			}
		}
		_, _, gen, _ := s.EdgeStates(ctx(t), 0)
		n, err := s.FirstManifests(ctx(t), fakeSign)
		if err != nil || n != 1 {
			t.Fatalf("first manifests: %d, %v; want 1", n, err)
		}
		if got := mustEdge(t, s, old.ID); got.Sequence != 1 {
			t.Fatalf("old edge after FirstManifests: sequence %d, want 1", got.Sequence)
		}
		verify(old.ID, 1)
		// The poll cache sees the change.
		states, _, _, err := s.EdgeStates(ctx(t), gen)
		if err != nil || len(states) != 1 || states[0].ID != old.ID || states[0].Sequence != 1 {
			t.Fatalf("edge states after FirstManifests: %+v, %v", states, err)
		}
		if n, err := s.FirstManifests(ctx(t), fakeSign); err != nil || n != 0 {
			t.Fatalf("first manifests again: %d, %v; want 0", n, err)
		}
	})
}
