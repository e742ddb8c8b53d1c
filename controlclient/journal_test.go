package controlclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"cellvisor/internal/testutil"
	"cellvisor/manifest"
)

func TestJournalSurvivesRestartAndDeliversInOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "acks.journal")
	j, err := OpenJournal(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for seq := int64(1); seq <= 3; seq++ {
		if err := j.Append(manifest.Ack{Sequence: seq, Status: manifest.AckApplied}); err != nil {
			t.Fatal(err)
		}
	}
	// A crash mid-append leaves a torn line; a restarted agent drops it.
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"sequence":4,"sta`)
	f.Close()
	j, err = OpenJournal(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := j.Pending(); len(p) != 3 || p[0].Sequence != 1 || p[2].Sequence != 3 {
		t.Fatalf("pending after restart: %+v", p)
	}

	var mu sync.Mutex
	var got []int64
	fails := 2 // the control plane is down for the first two tries
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		j.Run(ctx, func(_ context.Context, a manifest.Ack) error {
			mu.Lock()
			defer mu.Unlock()
			if fails > 0 {
				fails--
				return errors.New("control plane unreachable")
			}
			got = append(got, a.Sequence)
			return nil
		}, 20*time.Millisecond)
	}()
	testutil.Eventually(t, 10*time.Second, func() error {
		if p := j.Pending(); len(p) > 0 {
			return fmt.Errorf("still pending: %+v", p)
		}
		return nil
	})
	cancel()
	<-done
	if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Errorf("delivered %v, want 1 2 3 once each", got)
	}
	data, _ := os.ReadFile(path)
	if len(data) != 0 {
		t.Errorf("journal not compacted after delivery: %q", data)
	}
}

func TestJournalDropsOnlyDamagedLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "acks.journal")
	os.WriteFile(path, []byte("{\"sequence\":1,\"status\":\"applied\"}\nnot json\n{\"sequence\":3,\"status\":\"applied\"}\n"), 0o600)
	j, err := OpenJournal(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := j.Pending(); len(p) != 2 || p[0].Sequence != 1 || p[1].Sequence != 3 {
		t.Errorf("pending %+v, want 1 and 3", p)
	}
	long := bytes.Repeat([]byte("x"), 2<<20)
	os.WriteFile(path, append(long, '\n'), 0o600)
	if _, err := OpenJournal(path, nil); err == nil {
		t.Error("a line too long to read: want an error, not silently lost acks")
	}
}

// An ack the control API refuses as such (400) is dropped, so that it does
// not hold back the acks after it; an identity refusal (401) is retried.
func TestJournalDropsPermanentlyRefusedAcks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "acks.journal")
	j, err := OpenJournal(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []int64{0, 1, 2} {
		if err := j.Append(manifest.Ack{Sequence: seq, Status: manifest.AckRefused}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var got []int64
	unauthorized := 1
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		j.Run(ctx, func(_ context.Context, a manifest.Ack) error {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case a.Sequence == 0:
				return &HTTPError{Status: 400, Message: "sequence: want ≥ 1"}
			case a.Sequence == 1 && unauthorized > 0:
				unauthorized--
				return &HTTPError{Status: 401, Message: "rotated"}
			}
			got = append(got, a.Sequence)
			return nil
		}, 20*time.Millisecond)
	}()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, 10*time.Second, func() error {
		if p := j.Pending(); len(p) > 0 {
			return fmt.Errorf("still pending: %+v", p)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != 1 || got[1] != 2 || unauthorized != 0 {
		t.Errorf("delivered %v (401s left %d), want 1 (after its 401) and 2", got, unauthorized)
	}
}

// TestJournalRetriesWithBackoff runs Run in a synctest bubble, whose clock
// moves only when every goroutine waits: the gaps between tries are exactly
// what the backoff chose, growing up to the cap, and reset after a delivery.
func TestJournalRetriesWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j, err := OpenJournal(filepath.Join(t.TempDir(), "acks.journal"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Append(manifest.Ack{Sequence: 1, Status: manifest.AckApplied}); err != nil {
			t.Fatal(err)
		}
		const maxDelay = time.Second
		var tries []time.Time
		delivered := make(chan struct{})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			j.Run(ctx, func(_ context.Context, a manifest.Ack) error {
				tries = append(tries, time.Now())
				if len(tries) < 10 {
					return errors.New("control plane unreachable")
				}
				close(delivered)
				return nil
			}, maxDelay)
		}()
		<-delivered // the bubble's clock jumps to each timer while all wait
		synctest.Wait()
		if p := j.Pending(); len(p) != 0 {
			t.Fatalf("still pending after delivery: %+v", p)
		}
		cancel()
		<-done
		if len(tries) != 10 {
			t.Fatalf("%d tries, want 10", len(tries))
		}
		nominal := 100 * time.Millisecond
		for i := 1; i < len(tries); i++ {
			gap := tries[i].Sub(tries[i-1])
			lo, hi := nominal/2, min(nominal*3/2, maxDelay)
			if gap < lo || gap > hi {
				t.Errorf("gap before try %d: %s, want within [%s, %s]", i+1, gap, lo, hi)
			}
			nominal = min(nominal*2, maxDelay)
		}
	})
}
