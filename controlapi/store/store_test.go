package store

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// eachStore runs f against a fresh SQLite file and a fresh PostgreSQL
// database (skipped, with the reason, where none is configured).
func eachStore(t *testing.T, f func(t *testing.T, s *Store)) {
	t.Run(SQLite, func(t *testing.T) {
		f(t, open(t, filepath.Join(t.TempDir(), "control.db")))
	})
	t.Run(Postgres, func(t *testing.T) {
		f(t, open(t, testutil.Postgres(t)))
	})
}

func open(t *testing.T, dsn string) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.InitSetting(ctx, SigningKeySetting, "test-key"); err != nil {
		t.Fatal(err)
	}
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// testKey is what fakeSign opens the sealed key "test-key" to.
var testKey = ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))

// fakeSign opens the test's signing key, unsealed.
func fakeSign(sealed string) (ed25519.PrivateKey, error) {
	if sealed != "test-key" {
		return nil, fmt.Errorf("unknown sealed key %q", sealed)
	}
	return testKey, nil
}

// signedFor reports whether e carries the test key's signature for edgeID.
func signedFor(edgeID string, e manifest.Entry) bool {
	sig, err := base64.StdEncoding.DecodeString(e.Signature)
	return err == nil && ed25519.Verify(testKey.Public().(ed25519.PublicKey), manifest.SigningMessage(edgeID, e), sig)
}

// bytes builds a fixed artifact whatever the revision.
func bytes(b []byte) Builder { return func(int64) ([]byte, error) { return b, nil } }

func newEdge(t *testing.T, s *Store, name string) Edge {
	t.Helper()
	e, err := s.CreateEdge(ctx(t), NewEdge{
		ID: "id-" + name, Name: name, Org: "acme", Country: "DE", Continent: "EU", Slots: 8, TokenHash: "tok-" + name,
		Assignments: map[string]string{"cell-01": "shared-default", "cell-02": "quarantine-default"},
	}, fakeSign)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestMigrationsAreIdempotent(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		v, err := s.SchemaVersion(ctx(t))
		if err != nil || v != len(migrations) {
			t.Fatalf("schema version %d, %v; want %d", v, err, len(migrations))
		}
		if err := s.migrate(ctx(t)); err != nil {
			t.Fatalf("second migrate: %v", err)
		}
		pools, err := s.Pools(ctx(t))
		if err != nil || len(pools) != 2 || pools[0].Name != "quarantine-default" || pools[1].Name != "shared-default" {
			t.Fatalf("seeded pools %+v, %v", pools, err)
		}
	})
}

func TestEdgeLifecycle(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "fra-1")
		if e.Enrolled() || e.Sequence != 1 || e.Slots != 8 || e.Country != "DE" {
			t.Fatalf("new edge %+v", e)
		}
		if _, err := s.CreateEdge(ctx(t), NewEdge{ID: "other", Name: "fra-1", Slots: 1, TokenHash: "x"}, fakeSign); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate name: %v, want ErrConflict", err)
		}
		got, err := s.EdgeByToken(ctx(t), "tok-fra-1")
		if err != nil || got.ID != e.ID {
			t.Fatalf("by token: %+v, %v", got, err)
		}
		if err := s.Enroll(ctx(t), e.ID, "tok-fra-1", "csr1", "PEM", "serial1"); err != nil {
			t.Fatal(err)
		}
		if err := s.Enroll(ctx(t), e.ID, "tok-fra-1", "csr2", "PEM2", "serial2"); !errors.Is(err, ErrConflict) {
			t.Fatalf("second enroll: %v, want ErrConflict", err)
		}
		got, _ = s.Edge(ctx(t), e.ID)
		if got.CertSerial != "serial1" || got.CSRHash != "csr1" || got.EnrolledAt.IsZero() {
			t.Fatalf("enrolled edge %+v", got)
		}
		if err := s.Rotate(ctx(t), e.ID, "tok2", time.Time{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.EdgeByToken(ctx(t), "tok-fra-1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("old token after rotation: %v", err)
		}
		got, _ = s.Edge(ctx(t), e.ID)
		if got.Enrolled() || got.Rotations != 1 || got.CSRHash != "" {
			t.Fatalf("rotated edge %+v", got)
		}
		at := time.UnixMilli(1_800_000_000_000).UTC()
		if err := s.Touch(ctx(t), map[string]time.Time{e.ID: at}); err != nil {
			t.Fatal(err)
		}
		if err := s.Touch(ctx(t), map[string]time.Time{e.ID: at.Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
		got, _ = s.Edge(ctx(t), e.ID)
		if !got.LastSeen.Equal(at) {
			t.Fatalf("last seen %v, want %v (never moved back)", got.LastSeen, at)
		}
	})
}

func TestPublishAdvancesOnlyParticipatingEdges(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a, b := newEdge(t, s, "a"), newEdge(t, s, "b")
		// c has no shared-default cell.
		c, err := s.CreateEdge(ctx(t), NewEdge{ID: "id-c", Name: "c", Slots: 1, TokenHash: "tok-c",
			Assignments: map[string]string{"cell-01": "quarantine-default"}}, fakeSign)
		if err != nil {
			t.Fatal(err)
		}
		art := []byte(`{"domain":"x.example"}`)
		p, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes(art))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(art)
		if p.Domain.Revision != 1 || p.Domain.SHA256 != hex.EncodeToString(sum[:]) || len(p.Edges) != 0 || p.Pending != 2 || p.Fanout == 0 {
			t.Fatalf("published %+v", p)
		}
		for _, id := range []string{a.ID, b.ID} {
			if got := mustEdge(t, s, id); got.Sequence != 2 {
				t.Fatalf("edge %s at sequence %d, want 2 (1 is its first, empty)", id, got.Sequence)
			}
			es, err := s.Entries(ctx(t), id, 2, "", 500)
			if err != nil || len(es) != 1 || !signedFor(id, es[0]) {
				t.Fatalf("edge %s entries %+v, %v", id, es, err)
			}
			if data, err := s.Artifact(ctx(t), id, es[0].SHA256); err != nil || string(data) != string(art) {
				t.Fatalf("artifact for %s: %q, %v", id, data, err)
			}
		}
		if got := mustEdge(t, s, c.ID); got.Sequence != 1 {
			t.Fatalf("edge c advanced to %d", got.Sequence)
		}
		if _, err := s.Artifact(ctx(t), c.ID, p.Domain.SHA256); !errors.Is(err, ErrNotFound) {
			t.Fatalf("artifact for an edge not in its pool: %v, want ErrNotFound", err)
		}
		// Revision 2 moves the edges to sequence 3; sequence 2 stays readable.
		if _, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte(`{"v":2}`))); err != nil {
			t.Fatal(err)
		}
		if got := mustEdge(t, s, a.ID); got.Sequence != 3 {
			t.Fatalf("edge a built to sequence %d, want 3", got.Sequence)
		}
		old, _ := s.Entries(ctx(t), a.ID, 2, "", 500)
		cur, _ := s.Entries(ctx(t), a.ID, 3, "", 500)
		if len(old) != 1 || old[0].Revision != 1 || len(cur) != 1 || cur[0].Revision != 2 {
			t.Fatalf("seq 1 %+v, seq 2 %+v", old, cur)
		}
		// A new edge starts with every domain of its pools at sequence 1.
		d := newEdge(t, s, "d")
		if d.Sequence != 1 {
			t.Fatalf("new edge sequence %d, want 1", d.Sequence)
		}
		if es, _ := s.Entries(ctx(t), d.ID, 1, "", 500); len(es) != 1 || es[0].Revision != 2 || !signedFor(d.ID, es[0]) {
			t.Fatalf("new edge entries %+v", es)
		}
		if _, err := s.PublishDomain(ctx(t), "y.example", "reserved-none", nil, bytes(art)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown pool: %v", err)
		}
		del, err := s.DeleteDomain(ctx(t), "x.example")
		if err != nil || len(del.Edges) != 0 || del.Pending != 3 {
			t.Fatalf("delete: %+v, %v", del, err)
		}
		if got := mustEdge(t, s, a.ID); got.Sequence != 4 {
			t.Fatalf("edge a built to sequence %d after the delete, want 4", got.Sequence)
		}
		if es, _ := s.Entries(ctx(t), a.ID, 4, "", 500); len(es) != 0 {
			t.Fatalf("entries after delete: %+v", es)
		}
		if _, err := s.Entries(ctx(t), a.ID, 5, "", 500); !errors.Is(err, ErrNotFound) {
			t.Fatalf("future sequence: %v", err)
		}
		if p, _ := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes(art)); p.Domain.Revision != 3 {
			t.Fatalf("revision after delete and publish %d, want 3", p.Domain.Revision)
		}
	})
}

func TestPagingAndPruning(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "a")
		for i := range 7 {
			if _, err := s.PublishDomain(ctx(t), fmt.Sprintf("d%02d.example", i), "shared-default", nil, bytes([]byte{byte(i)})); err != nil {
				t.Fatal(err)
			}
		}
		// Seven publishes before the edge polls: one new sequence (1 is its
		// first, empty) with all seven.
		if got := mustEdge(t, s, e.ID); got.Sequence != 2 {
			t.Fatalf("built to sequence %d, want 2", got.Sequence)
		}
		var got []string
		after := ""
		for {
			es, err := s.Entries(ctx(t), e.ID, 2, after, 3)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range es {
				got = append(got, x.Domain)
			}
			if len(es) < 3 {
				break
			}
			after = es[len(es)-1].Domain
		}
		if len(got) != 7 || got[0] != "d00.example" || got[6] != "d06.example" {
			t.Fatalf("paged %v", got)
		}
		for i := range keepSequences + 2 {
			if _, err := s.PublishDomain(ctx(t), "d00.example", "shared-default", nil, bytes([]byte{byte(100 + i)})); err != nil {
				t.Fatal(err)
			}
			mustEdge(t, s, e.ID) // polled after each
		}
		cur, _ := s.Edge(ctx(t), e.ID)
		if _, err := s.Entries(ctx(t), e.ID, cur.Sequence-keepSequences, "", 10); !errors.Is(err, ErrNotFound) {
			t.Fatalf("pruned sequence readable: %v", err)
		}
		es, err := s.Entries(ctx(t), e.ID, cur.Sequence-keepSequences+1, "", 10)
		if err != nil || len(es) != 7 {
			t.Fatalf("oldest kept sequence: %d entries, %v", len(es), err)
		}
	})
}

func TestAcksAndTasks(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "a")
		for i := range 3 {
			if _, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte{byte(i)})); err != nil {
				t.Fatal(err)
			}
			if i < 2 {
				mustEdge(t, s, e.ID) // polled after the first two
			}
		}
		at := time.Now().UTC().Truncate(time.Millisecond)
		if err := s.Ack(ctx(t), e.ID, manifest.Ack{Sequence: 3, Status: manifest.AckRefused, Reason: "bad", At: at}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Edge(ctx(t), e.ID); got.ActiveSequence != 0 {
			t.Fatalf("a refusal moved the active sequence to %d", got.ActiveSequence)
		}
		if err := s.Ack(ctx(t), e.ID, manifest.Ack{Sequence: 3, Status: manifest.AckPartial, Cells: []string{"cell-01", "cell-02"}, At: at}); err != nil {
			t.Fatal(err)
		}
		acks, err := s.Acks(ctx(t), e.ID, 10)
		if err != nil || len(acks) != 1 || acks[0].Status != manifest.AckPartial || len(acks[0].Cells) != 2 || !acks[0].At.Equal(at) {
			t.Fatalf("acks %+v, %v", acks, err)
		}
		if got, _ := s.Edge(ctx(t), e.ID); got.ActiveSequence != 3 {
			t.Fatalf("active sequence %d, want 3", got.ActiveSequence)
		}
		// An ack of a sequence not built yet (revision 3 is unbuilt) is
		// kept, and moves nothing.
		if err := s.Ack(ctx(t), e.ID, manifest.Ack{Sequence: 4, Status: manifest.AckApplied, At: at}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Edge(ctx(t), e.ID); got.ActiveSequence != 3 || got.Sequence != 3 {
			t.Fatalf("an ack of sequence 4 before it was built: active %d, sequence %d", got.ActiveSequence, got.Sequence)
		}

		_, _, gen0, err := s.EdgeStates(ctx(t), 0)
		if err != nil {
			t.Fatal(err)
		}
		t1, err := s.CreateTask(ctx(t), e.ID, "cell-01", "drain")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateTask(ctx(t), "nope", "cell-01", "drain"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("task for unknown edge: %v", err)
		}
		states, _, gen1, err := s.EdgeStates(ctx(t), gen0)
		if err != nil || gen1 <= gen0 || len(states) != 1 || states[0].PendingTasks != 1 {
			t.Fatalf("states after a task: %+v gen %d→%d, %v", states, gen0, gen1, err)
		}
		if states, _, gen, _ := s.EdgeStates(ctx(t), gen1); len(states) != 0 || gen != gen1 {
			t.Fatalf("unchanged states %+v gen %d", states, gen)
		}
		if _, err := s.FinishTask(ctx(t), "other", t1.ID, "done", ""); !errors.Is(err, ErrNotFound) {
			t.Fatalf("finishing another edge's task: %v", err)
		}
		done, err := s.FinishTask(ctx(t), e.ID, t1.ID, "done", "drained")
		if err != nil || done.State != "done" || done.DoneAt.IsZero() {
			t.Fatalf("finish: %+v, %v", done, err)
		}
		if _, err := s.FinishTask(ctx(t), e.ID, t1.ID, "done", "drained"); err != nil {
			t.Fatalf("retried finish: %v", err)
		}
		if _, err := s.FinishTask(ctx(t), e.ID, t1.ID, "failed", "x"); !errors.Is(err, ErrConflict) {
			t.Fatalf("finish otherwise: %v", err)
		}
		pending, _ := s.Tasks(ctx(t), e.ID, true, 100)
		all, _ := s.Tasks(ctx(t), e.ID, false, 100)
		if len(pending) != 0 || len(all) != 1 {
			t.Fatalf("pending %+v all %+v", pending, all)
		}
	})
}

// Concurrent publishes to one edge are none of them lost: the edge's next
// poll builds one new sequence holding every one.
func TestConcurrentPublishes(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "a")
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Go(func() {
				_, err := s.PublishDomain(ctx(t), fmt.Sprintf("c%d.example", i), "shared-default", nil, bytes([]byte{byte(i)}))
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		got := mustEdge(t, s, e.ID)
		es, _ := s.Entries(ctx(t), e.ID, got.Sequence, "", 100)
		if got.Sequence != 2 || len(es) != 8 {
			t.Fatalf("sequence %d with %d entries, want 2 (1 is its first, empty) and 8", got.Sequence, len(es))
		}
	})
}

// A hostname answers for one domain: the edges would refuse a manifest in
// which two domains claim it, so the control plane refuses the publish.
func TestHostnamesAreClaimedOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "a")
		if _, err := s.PublishDomain(ctx(t), "a.example", "shared-default", []string{"a.example", "www.example"}, bytes([]byte("a"))); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PublishDomain(ctx(t), "b.example", "quarantine-default", []string{"b.example", "www.example"}, bytes([]byte("b"))); !errors.Is(err, ErrConflict) {
			t.Fatalf("a claimed hostname: %v, want ErrConflict", err)
		}
		if got := mustEdge(t, s, e.ID); got.Sequence != 2 {
			t.Fatalf("a refused publish moved the sequence to %d", got.Sequence)
		}
		// The owner may republish with it; once it lets go, another may claim it.
		if _, err := s.PublishDomain(ctx(t), "a.example", "shared-default", []string{"a.example"}, bytes([]byte("a2"))); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PublishDomain(ctx(t), "b.example", "quarantine-default", []string{"www.example"}, bytes([]byte("b"))); err != nil {
			t.Fatalf("a released hostname: %v", err)
		}
		if _, err := s.DeleteDomain(ctx(t), "b.example"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PublishDomain(ctx(t), "c.example", "shared-default", []string{"www.example"}, bytes([]byte("c"))); err != nil {
			t.Fatalf("the hostname of a deleted domain: %v", err)
		}
	})
}

// Pending tasks come oldest first even past the limit (a drain then an
// undrain must run in that order), and an ack cannot move the active
// sequence past the edge's sequence.
func TestPendingTasksOldestFirstAndAckBounds(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "a")
		for _, a := range []string{"drain", "undrain", "restart"} {
			if _, err := s.CreateTask(ctx(t), e.ID, "cell-01", a); err != nil {
				t.Fatal(err)
			}
		}
		ts, err := s.Tasks(ctx(t), e.ID, true, 2)
		if err != nil || len(ts) != 2 || ts[0].Action != "drain" || ts[1].Action != "undrain" {
			t.Fatalf("two pending tasks: %+v, %v; want drain, undrain", ts, err)
		}
		if err := s.Ack(ctx(t), e.ID, manifest.Ack{Sequence: 99, Status: manifest.AckApplied}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Edge(ctx(t), e.ID); got.ActiveSequence != 0 {
			t.Fatalf("an ack of a sequence never published moved the active sequence to %d", got.ActiveSequence)
		}
	})
}

// Edges created while domains are published and deleted end up with
// exactly the domains of their pools: neither side misses what the other
// commits (on PostgreSQL both take the generation counter first).
func TestEdgesCreatedDuringPublishesGetEveryDomain(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		for i := range 4 {
			if _, err := s.PublishDomain(ctx(t), fmt.Sprintf("old%d.example", i), "shared-default", nil, bytes([]byte{byte(i)})); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for i := range 8 {
			wg.Go(func() {
				_, err := s.CreateEdge(ctx(t), NewEdge{ID: fmt.Sprintf("e%d", i), Name: fmt.Sprintf("e%d", i), Slots: 1, TokenHash: fmt.Sprintf("t%d", i),
					Assignments: map[string]string{"cell-01": "shared-default"}}, fakeSign)
				errs <- err
			})
			wg.Go(func() {
				_, err := s.PublishDomain(ctx(t), fmt.Sprintf("new%d.example", i), "shared-default", nil, bytes([]byte{byte(i)}))
				errs <- err
			})
			if i < 4 {
				wg.Go(func() {
					_, err := s.DeleteDomain(ctx(t), fmt.Sprintf("old%d.example", i))
					errs <- err
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		domains, _ := s.Domains(ctx(t))
		want := map[string]bool{}
		for _, d := range domains {
			want[d.Name] = true
		}
		if len(want) != 8 {
			t.Fatalf("%d domains left, want the 8 new ones", len(want))
		}
		for i := range 8 {
			e := mustEdge(t, s, fmt.Sprintf("e%d", i))
			es, err := s.Entries(ctx(t), e.ID, e.Sequence, "", 100)
			if e.Sequence == 0 {
				es, err = nil, nil
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, x := range es {
				got[x.Domain] = true
			}
			if len(got) != len(want) {
				t.Errorf("edge %s at sequence %d has %v, want %v", e.ID, e.Sequence, got, want)
				continue
			}
			for d := range want {
				if !got[d] {
					t.Errorf("edge %s lacks %s", e.ID, d)
				}
			}
		}
	})
}

func TestDeleteEdge(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "a")
		keep := newEdge(t, s, "b")
		if _, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, bytes([]byte("x"))); err != nil {
			t.Fatal(err)
		}
		mustEdge(t, s, keep.ID)
		if _, err := s.CreateTask(ctx(t), e.ID, "cell-01", "drain"); err != nil {
			t.Fatal(err)
		}
		if err := s.Ack(ctx(t), e.ID, manifest.Ack{Sequence: 1, Status: manifest.AckApplied}); err != nil {
			t.Fatal(err)
		}
		_, _, before, _ := s.EdgeStates(ctx(t), 0)
		if err := s.DeleteEdge(ctx(t), e.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteEdge(ctx(t), e.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleting twice: %v", err)
		}
		if _, err := s.Edge(ctx(t), e.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted edge: %v", err)
		}
		if _, err := s.Entries(ctx(t), e.ID, 1, "", 10); !errors.Is(err, ErrNotFound) {
			t.Fatalf("entries of a deleted edge: %v", err)
		}
		if ts, _ := s.Tasks(ctx(t), e.ID, false, 10); len(ts) != 0 {
			t.Fatalf("tasks of a deleted edge: %+v", ts)
		}
		states, deleted, _, err := s.EdgeStates(ctx(t), before)
		if err != nil || len(states) != 0 || len(deleted) != 1 || deleted[0] != e.ID {
			t.Fatalf("changes after the delete: %+v %v, %v", states, deleted, err)
		}
		if es, err := s.Entries(ctx(t), keep.ID, 2, "", 10); err != nil || len(es) != 1 {
			t.Fatalf("the other edge's entries: %+v, %v", es, err)
		}
		// The name is free again.
		if _, err := s.CreateEdge(ctx(t), NewEdge{ID: "id-a2", Name: "a", Slots: 1, TokenHash: "t-a2"}, fakeSign); err != nil {
			t.Fatalf("reuse the name: %v", err)
		}
	})
}
