package store

import (
	"fmt"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/manifest"
)

func TestFleetQueries(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a := newEdge(t, s, "a")
		b := newEdge(t, s, "b")
		reserved(t, s, "reserved-eu", 1, 0)
		assign(t, s, a.ID, "cell-03", "reserved-eu")
		for _, d := range []string{"f.example", "g.example", "h.example"} {
			if _, err := s.PublishDomain(ctx(t), d, "shared-default", nil, bytes([]byte(d))); err != nil {
				t.Fatal(err)
			}
		}

		// f fails on a refusal; g waits past its deadline; h waits in time.
		if _, _, err := s.StartMove(ctx(t), "f.example", "reserved-eu", time.Hour, fakeSign); err != nil {
			t.Fatal(err)
		}
		seq := mustEdge(t, s, a.ID).Sequence
		if err := s.Ack(ctx(t), a.ID, manifest.Ack{Sequence: seq, Status: manifest.AckRefused, Reason: "artifact invalid", At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if m, _, err := s.StepMove(ctx(t), "f.example", fakeSign, fakeRebuild); err != nil || m.State != adminapi.MoveFailed {
			t.Fatalf("f: %+v, %v", m, err)
		}
		if _, _, err := s.StartMove(ctx(t), "g.example", "reserved-eu", time.Second, fakeSign); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.StartMove(ctx(t), "h.example", "reserved-eu", time.Hour, fakeSign); err != nil {
			t.Fatal(err)
		}
		s.Now = func() time.Time { return time.Now().Add(time.Minute) }
		moves, err := s.FailingMoves(ctx(t), 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range moves {
			got = append(got, m.Domain+":"+m.State)
		}
		if fmt.Sprint(got) != "[g.example:waiting f.example:failed]" {
			t.Fatalf("failing moves %v, want g (past its deadline) then f (failed)", got)
		}
		s.Now = time.Now

		if err := s.Ack(ctx(t), b.ID, manifest.Ack{Sequence: mustEdge(t, s, b.ID).Sequence, Status: manifest.AckRefused, Reason: "b refused", At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		acks, err := s.RecentAcks(ctx(t), manifest.AckRefused, 1)
		if err != nil || len(acks) != 1 || acks[0].EdgeName != "b" || acks[0].Reason != "b refused" || acks[0].ReceivedAt.IsZero() {
			t.Fatalf("newest refusal %+v, %v", acks, err)
		}
		if acks, err := s.RecentAcks(ctx(t), manifest.AckRefused, 10); err != nil || len(acks) != 2 {
			t.Fatalf("refusals %+v, %v", acks, err)
		}

		// Paging by name; silent: enrolled and unseen.
		page, err := s.EdgesPage(ctx(t), EdgeFilter{After: "a", Limit: 5})
		if err != nil || len(page) != 1 || page[0].Name != "b" {
			t.Fatalf("page after a: %+v, %v", page, err)
		}
		if n, err := s.CountEdges(ctx(t)); err != nil || n != 2 {
			t.Fatalf("count %d, %v", n, err)
		}
		if ids, err := s.SilentEdges(ctx(t), time.Now()); err != nil || len(ids) != 0 {
			t.Fatalf("silent before enrollment %v, %v", ids, err)
		}
		if err := s.Enroll(ctx(t), a.ID, "tok-a", "csr", "cert", "serial-a"); err != nil {
			t.Fatal(err)
		}
		if ids, err := s.SilentEdges(ctx(t), time.Now()); err != nil || len(ids) != 1 || ids[0] != a.ID {
			t.Fatalf("silent, enrolled and never seen: %v, %v", ids, err)
		}
		if err := s.Touch(ctx(t), map[string]time.Time{a.ID: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if ids, err := s.SilentEdges(ctx(t), time.Now().Add(-time.Minute)); err != nil || len(ids) != 0 {
			t.Fatalf("silent, just seen: %v, %v", ids, err)
		}
		if page, err := s.EdgesPage(ctx(t), EdgeFilter{Limit: 5, SilentBefore: time.Now().Add(time.Minute)}); err != nil || len(page) != 1 || page[0].Name != "a" {
			t.Fatalf("silent page: %+v, %v", page, err)
		}
	})
}
