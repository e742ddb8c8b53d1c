package supervisor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"cellvisor/cellapi"
)

// A proof dated as far ahead as the window allows is accepted once, and its
// replays are refused for as long as its timestamp is acceptable: the cell
// remembers the nonce until the timestamp has left the window, not for a
// fixed time from the first use. (It used to keep nonces twice the window
// from first use, while a proof dated ahead stays good until its timestamp
// plus the window: a replay just before that was accepted a second time.)
func TestProofDatedAheadIsAcceptedOnce(t *testing.T) {
	const window = 1 // seconds, to keep the test short
	h := newHarness(t, harnessOpts{slots: 1, authWindow: window})
	h.waitReady("cell-01", 0)
	c := privateClient(t, h, "cell-01", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Start just after a second boundary: the old rule's hole was widest
	// there (nearly a second).
	for time.Now().Nanosecond() > 100e6 {
		time.Sleep(5 * time.Millisecond) // waiting for the wall clock itself
	}
	ts := time.Now().Truncate(time.Second).Add(window * time.Second)
	proof := c.Headers("GET", "/status", ts)
	if _, err := c.Do(ctx, "GET", "/status", proof); err != nil {
		t.Fatalf("first use of a proof dated %ds ahead: %v", window, err)
	}
	// Replay until the timestamp is stale for certain (the cell's clock is
	// whole seconds: ts + window + 1, and a margin).
	end := ts.Add((window + 1) * time.Second).Add(500 * time.Millisecond)
	replays := 0
	for time.Now().Before(end) {
		_, err := c.Do(ctx, "GET", "/status", proof)
		// Refused as replayed (401) while the timestamp is good, then as
		// expired (408), never accepted.
		if !errors.Is(err, cellapi.ErrUnauthorized) && !errors.Is(err, cellapi.ErrExpired) {
			t.Fatalf("replay %d at %s (proof dated %s): %v, want a refusal",
				replays+1, time.Now().Format("15:04:05.000"), ts.Format("15:04:05"), err)
		}
		replays++
		time.Sleep(20 * time.Millisecond) // pacing the replays, not synchronising
	}
	if replays < 50 {
		t.Errorf("only %d replays were tried", replays)
	}
}
