package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// runBatcher runs b until the test ends.
func runBatcher(t *testing.T, b *Batcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// Writes queued while the writer is busy commit together, in one
// transaction, each answered only once it is readable; one that fails (an
// unknown edge) fails alone.
func TestBatcherGroupCommits(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		const edges = 20
		var ids []string
		for i := range edges {
			ids = append(ids, newEdge(t, s, fmt.Sprintf("e%02d", i)).ID)
		}
		var mu sync.Mutex
		var sizes []int
		wrote := map[string]int{}
		s.Hooks.Batch = func(n int) { mu.Lock(); sizes = append(sizes, n); mu.Unlock() }
		s.Hooks.Wrote = func(kind string) { mu.Lock(); wrote[kind]++; mu.Unlock() }
		b := s.NewBatcher(0)
		at := time.Now().UTC().Truncate(time.Millisecond)
		errs := make(chan error, 2*edges+1)
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Go(func() {
				err := b.Ack(ctx(t), id, manifest.Ack{Sequence: 1, Status: manifest.AckApplied, At: at})
				if err == nil { // answered: committed, so readable
					if e, _ := s.Edge(ctx(t), id); e.ActiveSequence != 1 {
						err = fmt.Errorf("edge %s answered before its ack was readable: active %d", id, e.ActiveSequence)
					}
				}
				errs <- err
			})
			wg.Go(func() {
				err := b.PutStatus(ctx(t), id, Report{Status: []byte(`{"slots":[]}`), At: at})
				if err == nil {
					if e, _ := s.Edge(ctx(t), id); e.StatusAt.IsZero() {
						err = fmt.Errorf("edge %s answered before its status was readable", id)
					}
				}
				errs <- err
			})
		}
		var unknown error
		wg.Go(func() { unknown = b.PutStatus(ctx(t), "nope", Report{Status: []byte(`{}`), At: at}) })
		// Every write queued before the writer runs: one batch holds them.
		testutil.Eventually(t, 10*time.Second, func() error {
			if n := len(b.ch); n != 2*edges+1 {
				return fmt.Errorf("%d writes queued", n)
			}
			return nil
		})
		runBatcher(t, b)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if !errors.Is(unknown, ErrNotFound) {
			t.Errorf("status of an unknown edge: %v, want ErrNotFound", unknown)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(sizes) != 1 || sizes[0] != 2*edges+1 {
			t.Errorf("batches %v, want one of %d", sizes, 2*edges+1)
		}
		if wrote["Ack"] != edges || wrote["PutStatus"] != edges {
			t.Errorf("writes counted %v, want %d of each", wrote, edges)
		}
	})
}

// A writer that stops fails what is still queued and refuses more.
func TestBatcherStops(t *testing.T) {
	s := open(t, t.TempDir()+"/control.db")
	id := newEdge(t, s, "a").ID
	b := s.NewBatcher(0)
	queued := make(chan error, 1)
	go func() { queued <- b.Ack(ctx(t), id, manifest.Ack{Sequence: 1, Status: manifest.AckApplied}) }()
	testutil.Eventually(t, 10*time.Second, func() error {
		if len(b.ch) != 1 {
			return errors.New("not queued yet")
		}
		return nil
	})
	rctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.Run(rctx) // returns at once: ctx is over
	if err := <-queued; !errors.Is(err, ErrStopped) {
		t.Fatalf("a queued write when the writer stopped: %v, want ErrStopped", err)
	}
	if err := b.Ack(ctx(t), id, manifest.Ack{Sequence: 1, Status: manifest.AckApplied}); !errors.Is(err, ErrStopped) {
		t.Fatalf("a write after the writer stopped: %v, want ErrStopped", err)
	}
	if e, _ := s.Edge(ctx(t), id); e.ActiveSequence != 0 {
		t.Fatalf("a refused write was committed: active %d", e.ActiveSequence)
	}
}
