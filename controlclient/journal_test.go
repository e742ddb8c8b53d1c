package controlclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
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
	// A line too long to keep, between good ones: dropped and counted, the
	// others kept; the agent starts.
	long := bytes.Repeat([]byte("x"), 2<<20)
	var b bytes.Buffer
	b.WriteString("{\"sequence\":1,\"status\":\"applied\"}\n")
	b.Write(append(long, '\n'))
	b.WriteString("{\"sequence\":3,\"status\":\"refused\",\"reason\":\"x\"}\n")
	os.WriteFile(path, b.Bytes(), 0o600)
	j, err = OpenJournal(path, nil)
	if err != nil {
		t.Fatalf("a damaged journal must not stop the agent: %v", err)
	}
	if p := j.Pending(); len(p) != 2 || p[0].Sequence != 1 || p[1].Sequence != 3 || j.Dropped() != 1 {
		t.Errorf("pending %+v, dropped %d: want 1 and 3, one dropped", p, j.Dropped())
	}
	// The damaged line is gone from the file once it was read.
	if data, _ := os.ReadFile(path); bytes.Contains(data, []byte("xxxx")) {
		t.Error("the overlong line is still in the journal")
	}
}

// A refusal whose reason is attacker-controlled and huge (a page entry's
// domain of megabytes, quoted in the reason) is journaled cut and escaped,
// so that the agent restarts with the journal it wrote. Before, such a
// reason made a journal line over the reader's bound, and the agent refused
// to start until its journal was removed by hand.
func TestHugeRefusalReasonDoesNotStopARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "acks.journal")
	j, err := OpenJournal(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	evil := strings.Repeat("a", 3<<20) + "\x1b[2J\n\u202e"
	_, perr := manifest.DecodePage([]byte(`{"edge_id":"e","sequence":2,"entries":[{"domain":"` + evil[:3<<20] + `","pool":"shared-default","revision":1,"size":1,"sha256":"x","signature":"x"}]}`))
	if perr == nil {
		t.Fatal("page accepted")
	}
	for _, reason := range []string{perr.Error(), evil} {
		if err := j.Append(manifest.Ack{Sequence: 2, Status: manifest.AckRefused, Reason: reason}); err != nil {
			t.Fatal(err)
		}
	}
	j, err = OpenJournal(path, nil)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	p := j.Pending()
	if len(p) != 2 {
		t.Fatalf("pending %d acks, want 2", len(p))
	}
	for _, a := range p {
		if len(a.Reason) > manifest.MaxReasonBytes || strings.ContainsAny(a.Reason, "\x1b\n\u202e") {
			t.Errorf("reason not bounded and escaped: %d bytes %q", len(a.Reason), a.Reason[:min(len(a.Reason), 80)])
		}
	}
	if !strings.HasPrefix(p[0].Reason, "invalid manifest: entry") {
		t.Errorf("reason lost its start: %q", p[0].Reason)
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
