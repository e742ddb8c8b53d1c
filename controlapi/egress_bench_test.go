package controlapi_test

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
	"cellvisor/egress"
	"cellvisor/testkit/testutil"
)

// BenchmarkElect: election decisions per second on one control replica
// for 1,000 live edges in one org, re-resolve included (the org's members
// and their reach read from the store, the lease read and renewed or
// acquired), on SQLite and on PostgreSQL.
func BenchmarkElect(b *testing.B) {
	b.Run(store.SQLite, func(b *testing.B) { benchElect(b, filepath.Join(b.TempDir(), "control.db"), false) })
	b.Run(store.Postgres, func(b *testing.B) { benchElect(b, testutil.Postgres(b), false) })
}

// BenchmarkElectDistinct is BenchmarkElect's worst case for the members
// query: every edge ranks differently (its own weight), so no two share a
// group and the query returns 1,000 rows.
func BenchmarkElectDistinct(b *testing.B) {
	b.Run(store.SQLite, func(b *testing.B) { benchElect(b, filepath.Join(b.TempDir(), "control.db"), true) })
	b.Run(store.Postgres, func(b *testing.B) { benchElect(b, testutil.Postgres(b), true) })
}

func benchElect(b *testing.B, dsn string, distinct bool) {
	e := serveOn(b, dsn, make([]byte, 32))
	c := ctx(b)
	if _, err := e.admin.SetEgressPolicy(c, "acme", "metering", adminapi.EgressPolicyRequest{Destination: egressDest, Region: "eu"}); err != nil {
		b.Fatal(err)
	}
	noSign := func(string) (ed25519.PrivateKey, error) { return nil, errors.New("no domains, nothing to sign") }
	now := time.Now()
	reach := map[string]store.Reach{"metering": {Destination: egressDest, Reachable: true, CheckedAt: now}}
	ids := make([]string, 1000)
	seen := map[string]time.Time{}
	for i := range ids {
		region := "eu"
		if i%2 == 1 {
			region = "us"
		}
		ids[i] = uuid.NewString()
		weight := 100
		if distinct {
			weight += i
		}
		_, err := e.st.CreateEdge(c, store.NewEdge{ID: ids[i], Name: fmt.Sprintf("edge-%04d", i), Org: "acme", Country: "DE", Continent: "EU",
			Slots: 1, TokenHash: "tok-" + ids[i], Topology: store.Topology{Region: region, Priority: 100, Weight: weight}}, noSign)
		if err != nil {
			b.Fatal(err)
		}
		if err := e.st.Enroll(c, ids[i], "tok-"+ids[i], "csr", "pem", "serial-"+ids[i]); err != nil {
			b.Fatal(err)
		}
		if err := e.st.PutEgressReport(c, ids[i], "https://127.0.0.1:7001/", reach); err != nil {
			b.Fatal(err)
		}
		seen[ids[i]] = now.Add(time.Hour) // live for the whole run
	}
	if err := e.st.Touch(c, seen); err != nil {
		b.Fatal(err)
	}
	// Every edge asks once: exactly one is elected.
	elected := 0
	for _, id := range ids {
		r, err := e.srv.Elect(c, id, egress.Metering, true)
		if err != nil {
			b.Fatal(err)
		}
		if r.Outcome == edgeapi.OutcomeElected {
			elected++
		}
	}
	if elected != 1 {
		b.Fatalf("%d elected of 1,000, want 1", elected)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := e.srv.Elect(c, ids[i%len(ids)], egress.Metering, true); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}
