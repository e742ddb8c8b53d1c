package controlclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/internal/clock"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// A 429 holds back its class for at least its Retry-After (plus up to half
// again), on the client's clock; the other classes go at once.
func TestRetryAfterHoldsBackTheClass(t *testing.T) {
	var acks, reports atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+edgeapi.PathAcks, func(w http.ResponseWriter, r *http.Request) {
		if acks.Add(1) == 1 {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"error":"the control API is serving its limit of 1 ack requests"}`))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST "+edgeapi.PathStatus, func(w http.ResponseWriter, r *http.Request) {
		reports.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	c := fakeControl(t, mux)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c.o.Clock = clk
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	ack := manifest.Ack{Sequence: 1, Status: manifest.AckApplied}
	err := c.Ack(ctx, ack)
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusTooManyRequests || he.RetryAfter != 3*time.Second || !he.Retryable() {
		t.Fatalf("ack refused 429: %v, want a retryable *HTTPError asking for 3s", err)
	}
	if err := c.Report(ctx, edgeapi.StatusReport{Status: []byte(`{}`)}); err != nil || reports.Load() != 1 {
		t.Fatalf("a status report while acks are held back: %v (%d sent), want sent at once", err, reports.Load())
	}

	done := make(chan error, 1)
	go func() { done <- c.Ack(ctx, ack) }()
	if err := clk.AwaitWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(3*time.Second - time.Millisecond)
	if n := acks.Load(); n != 1 || clk.Waiters() != 1 {
		t.Fatalf("%d acks sent, %d waiting, before the Retry-After: want 1 sent, still waiting", n, clk.Waiters())
	}
	clk.Advance(1500*time.Millisecond + time.Millisecond) // the jitter: at most half the Retry-After
	if err := <-done; err != nil || acks.Load() != 2 {
		t.Fatalf("ack after its Retry-After: %v (%d sent)", err, acks.Load())
	}
	// The wait is over: the next goes at once.
	if err := c.Ack(ctx, ack); err != nil || acks.Load() != 3 {
		t.Fatalf("next ack: %v (%d sent)", err, acks.Load())
	}
}

// A Retry-After is read within its bounds: missing on a 429 is the
// default, huge is the maximum, and only 429 and 503 carry one.
func TestRetryAfterIsBounded(t *testing.T) {
	for _, tc := range []struct {
		code   int
		header string
		want   time.Duration
	}{
		{http.StatusTooManyRequests, "2", 2 * time.Second},
		{http.StatusTooManyRequests, "", edgeapi.DefaultRetryAfter},
		{http.StatusTooManyRequests, "soon", edgeapi.DefaultRetryAfter},
		{http.StatusTooManyRequests, "999999999", edgeapi.MaxRetryAfter},
		{http.StatusServiceUnavailable, "5", 5 * time.Second},
		{http.StatusServiceUnavailable, "", 0},
		{http.StatusInternalServerError, "5", 0},
	} {
		resp := &http.Response{StatusCode: tc.code, Header: http.Header{}}
		if tc.header != "" {
			resp.Header.Set("Retry-After", tc.header)
		}
		if got := retryAfter(resp); got != tc.want {
			t.Errorf("HTTP %d, Retry-After %q: %s, want %s", tc.code, tc.header, got, tc.want)
		}
	}
}

// The ack journal keeps its promise across 429s: every ack is delivered,
// in order, none dropped, each resent no sooner than its Retry-After.
func TestJournalDeliversAcrossTooManyRequests(t *testing.T) {
	var mu sync.Mutex
	var tries []time.Time
	var taken []int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+edgeapi.PathAcks, func(w http.ResponseWriter, r *http.Request) {
		var a manifest.Ack
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		tries = append(tries, time.Now())
		if len(tries)%2 == 1 { // every other try refused
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		taken = append(taken, a.Sequence)
		w.WriteHeader(http.StatusNoContent)
	})
	c := fakeControl(t, mux)
	j, err := OpenJournal(filepath.Join(t.TempDir(), "acks.journal"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for seq := int64(1); seq <= 3; seq++ {
		if err := j.Append(manifest.Ack{Sequence: seq, Status: manifest.AckApplied}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan struct{})
	go func() { defer close(done); j.Run(ctx, c.Ack, time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, 30*time.Second, func() error {
		if p := j.Pending(); len(p) > 0 {
			return fmt.Errorf("acks still pending: %+v", p)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(taken) != 3 || taken[0] != 1 || taken[1] != 2 || taken[2] != 3 {
		t.Fatalf("acks taken %v, want 1, 2, 3", taken)
	}
	for i := 1; i < len(tries); i += 2 {
		if gap := tries[i].Sub(tries[i-1]); gap < time.Second {
			t.Errorf("try %d came %s after a 429 asking for 1s", i+1, gap)
		}
	}
}

// An enrollment refused 429 is sent again, the same, after its
// Retry-After; a bounded number of times.
func TestEnrollmentWaitsOutTooManyRequests(t *testing.T) {
	var mu sync.Mutex
	var tries []time.Time
	var bodies []string
	refuse := 1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		tries, bodies = append(tries, time.Now()), append(bodies, string(b))
		if len(tries) <= refuse {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := postEnroll(ctx, srv.Client(), srv.URL, []byte(`{"token":"t","csr":"c"}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("enroll after a 429: %v %v", resp, err)
	}
	resp.Body.Close()
	mu.Lock()
	if len(tries) != 2 || tries[1].Sub(tries[0]) < time.Second || bodies[0] != bodies[1] {
		t.Fatalf("%d tries, %v apart, bodies %q: want 2, at least 1s apart, the same", len(tries), tries[len(tries)-1].Sub(tries[0]), bodies)
	}
	tries, refuse = nil, 100
	mu.Unlock()
	resp, err = postEnroll(ctx, srv.Client(), srv.URL, []byte(`{}`))
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("enroll refused every time: %v %v, want the last 429", resp, err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(tries) != enrollTries {
		t.Fatalf("%d tries, want %d", len(tries), enrollTries)
	}
}
