package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"cellvisor/testkit/testutil"
)

// BenchmarkPublishFleet publishes one revision of a domain to a pool with
// a cell on each of publishEdges edges, every edge already holding
// `others` domains of the pool. It reports the wall time of one publish,
// per edge, and the rows written per edge (entries inserted and closed,
// headers, edge rows bumped), counted from the tables. Then what each
// edge's next poll does (Build): its time and rows per edge, all of the
// b.N publishes in one new sequence. The header signed for each edge
// digests every entry of that edge, so a build's cost grows with
// `others`: the sub-benchmarks show by how much.
func BenchmarkPublishFleet(b *testing.B) {
	for _, dialect := range []string{SQLite, Postgres} {
		for _, others := range []int{0, 50} {
			b.Run(fmt.Sprintf("%s/others=%d", dialect, others), func(b *testing.B) {
				dsn := filepath.Join(b.TempDir(), "control.db")
				if dialect == Postgres {
					dsn = testutil.Postgres(b)
				}
				benchPublish(b, dsn, others)
			})
		}
	}
}

const publishEdges = 1000

func benchPublish(b *testing.B, dsn string, others int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s, err := Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.InitSetting(ctx, SigningKeySetting, "test-key"); err != nil {
		b.Fatal(err)
	}
	for i := range publishEdges {
		if _, err := s.CreateEdge(ctx, NewEdge{ID: fmt.Sprintf("e%04d", i), Name: fmt.Sprintf("edge-%04d", i), Org: "o", Country: "DE",
			Continent: "EU", Slots: 8, TokenHash: fmt.Sprintf("t%04d", i), Assignments: map[string]string{"cell-01": "shared-default"}}, fakeSign); err != nil {
			b.Fatal(err)
		}
	}
	for i := range others {
		d := fmt.Sprintf("other%03d.example", i)
		if _, err := s.PublishDomain(ctx, d, "shared-default", nil, bytes([]byte(d))); err != nil {
			b.Fatal(err)
		}
	}
	// The first publish places the domain (one placement row per edge);
	// the measured ones are later revisions, as most publishes are.
	if _, err := s.PublishDomain(ctx, "bench.example", "shared-default", nil, bytes([]byte("0"))); err != nil {
		b.Fatal(err)
	}
	for i := range publishEdges { // the edges polled: built to every domain
		if _, err := s.Build(ctx, fmt.Sprintf("e%04d", i), fakeSign); err != nil {
			b.Fatal(err)
		}
	}
	var start int64
	if err := s.db.QueryRowContext(ctx, `SELECT MAX(sequence) FROM edges`).Scan(&start); err != nil {
		b.Fatal(err)
	}
	if b.N >= keepSequences {
		b.Fatalf("b.N %d: at most %d publishes keep every row countable (run with -benchtime Nx)", b.N, keepSequences-1)
	}
	b.ResetTimer()
	for i := range b.N {
		p, err := s.PublishDomain(ctx, "bench.example", "shared-default", nil, bytes([]byte(fmt.Sprint(i+1))))
		if err != nil || p.Pending != publishEdges {
			b.Fatalf("publish: %d edges, %v", p.Pending, err)
		}
	}
	b.StopTimer()
	published := b.Elapsed()
	count := func(q string) float64 {
		var n int64
		if err := s.db.QueryRowContext(ctx, s.q(q), start).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return float64(n)
	}
	per := float64(b.N) * publishEdges
	written := func() (rows, inserted float64) {
		inserted = count(`SELECT COUNT(*) FROM manifest_entries WHERE from_seq > ?`)
		closed := count(`SELECT COUNT(*) FROM manifest_entries WHERE to_seq > ?`)
		headers := count(`SELECT COUNT(*) FROM manifest_headers WHERE sequence > ?`)
		bumps := count(`SELECT COALESCE(SUM(sequence - ?), 0) FROM edges`)
		return inserted + closed + headers + bumps, inserted
	}
	rows, inserted := written()
	b.ReportMetric(float64(published.Nanoseconds())/float64(b.N)/publishEdges, "ns/edge")
	b.ReportMetric(rows/per, "rows/edge")
	b.ReportMetric(inserted/per, "entries-inserted/edge")
	// What the publishes left to each edge's next poll: one build each,
	// timed one after the other (a poll builds its own edge only).
	start2 := time.Now()
	for i := range publishEdges {
		if r, err := s.Build(ctx, fmt.Sprintf("e%04d", i), fakeSign); err != nil || !r.Advanced {
			b.Fatalf("build: %+v, %v", r, err)
		}
	}
	b.ReportMetric(float64(time.Since(start2).Nanoseconds())/publishEdges, "build-ns/edge")
	built, _ := written()
	b.ReportMetric((built-rows)/publishEdges, "build-rows/edge")
}
