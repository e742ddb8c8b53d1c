package controlapi

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"cellvisor/controlapi/store"
)

// TestACMELease: one replica holds the ACME lease and renews it; another
// takes it over only once it has expired.
func TestACMELease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var mu sync.Mutex
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	a := &acmeLease{st: st, holder: "a", ttl: time.Minute, now: clock}
	b := &acmeLease{st: st, holder: "b", ttl: time.Minute, now: clock}
	lead := func(l *acmeLease, want bool, when string) {
		t.Helper()
		got, err := l.lead(ctx)
		if err != nil || got != want {
			t.Fatalf("%s: replica %s leads %v (%v), want %v", when, l.holder, got, err, want)
		}
	}
	lead(a, true, "first")
	lead(b, false, "a holds it")
	advance(50 * time.Second)
	lead(a, true, "a renews") // now until 50 s + 1 min
	advance(50 * time.Second)
	lead(b, false, "a's renewal still runs")
	advance(11 * time.Second)
	lead(b, true, "a's lease expired")
	lead(a, false, "b took over")
}
