package outbound

import (
	"context"
	"testing"
	"time"

	"cellvisor/edgeapi"
)

// BenchmarkJournalPutRemove is one bundle journaled (written, fsynced,
// renamed, directory fsynced) and removed once delivered.
func BenchmarkJournalPutRemove(b *testing.B) {
	j, err := OpenJournal(context.Background(), b.TempDir(), 1000, 64<<20, nil)
	if err != nil {
		b.Fatal(err)
	}
	items := []Metering{{Cell: "cell-01", Requests: 42}, {Cell: "cell-02", Requests: 7}}
	for b.Loop() {
		bd, err := NewBundle("acme", "edge-a", "metering", time.Now(), items)
		if err != nil {
			b.Fatal(err)
		}
		if err := j.Put(bd); err != nil {
			b.Fatal(err)
		}
		if err := j.Remove(bd.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDirectDelivery is a bundle from submission to the destination's
// ingest by the elected holder: journaled, fenced with the control API
// (mutual TLS), posted, removed.
func BenchmarkDirectDelivery(b *testing.B) {
	e := newEnv(b, time.Hour)
	a := e.startEdge("edge-a", org, edgeOpts{maxBundles: 1000})
	a.awaitRoute(b, "metering", edgeapi.RouteDirect)
	for b.Loop() {
		bd, _ := NewBundle(org, "edge-a", "metering", time.Now(), 1)
		if err := a.sender.Submit(bd); err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			if _, ok := e.ingest.Bundle(bd.ID); ok {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("bundle %s not ingested within 10s", bd.ID)
			}
			time.Sleep(50 * time.Microsecond) // a poll interval, not a wait for an event
		}
	}
}
