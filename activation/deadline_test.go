package activation

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"cellvisor/manifest"
)

// slowSource answers each page and artifact only after delay (or hangs,
// with delay 0) unless the context ends first: a source that never
// answers, or one whose every answer is slow but within its own timeout.
type slowSource struct {
	*memSource
	delay time.Duration
}

func (s slowSource) wait(ctx context.Context) error {
	var c <-chan time.Time
	if s.delay > 0 {
		t := time.NewTimer(s.delay)
		defer t.Stop()
		c = t.C
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c:
		return nil
	}
}

func (s slowSource) Page(ctx context.Context, after int64, cursor string) (manifest.Page, error) {
	if err := s.wait(ctx); err != nil {
		return manifest.Page{}, err
	}
	return s.memSource.Page(ctx, after, cursor)
}

func (s slowSource) Snapshot(ctx context.Context) (io.ReadCloser, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.memSource.Snapshot(ctx)
}

// A poll has one deadline for everything it fetches: a source that hangs,
// or one that pages slowly, fails the poll at the deadline (retried later)
// instead of holding it forever, and the active release stays.
func TestPollHasAnOverallDeadline(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
		pages int
	}{
		{"a source that hangs", 0, 1},
		{"many slow pages", 20 * time.Millisecond, 200},
		{"a snapshot that hangs", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.publish(1, map[string]string{"a.example.com": "v1"})
			if err := r.a.Poll(context.Background()); err != nil || r.a.Active() != 1 {
				t.Fatalf("first poll: %v, active %d", err, r.a.Active())
			}
			if tc.pages == 0 {
				r.a.mu.Lock()
				r.a.active = 0 // a new edge: asks for the snapshot first
				r.a.mu.Unlock()
			}
			domains := map[string]string{}
			for i := range max(tc.pages, 1) * 2 {
				domains[strings.Repeat("x", 1)+string(rune('a'+i%26))+strings.Repeat("y", i/26)+".example.com"] = "v2"
			}
			r.publish(2, domains)
			r.src.pageSize = 2
			r.a.o.Source = slowSource{r.src, tc.delay}
			r.a.o.PollTimeout = 300 * time.Millisecond
			done := make(chan error, 1)
			go func() { done <- r.a.Poll(context.Background()) }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "poll_timeout") && tc.pages == 0 {
					t.Errorf("poll: %v, want the poll's deadline", err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the poll outlived its deadline by a minute")
			}
			if tc.pages > 0 && (r.a.Active() != 1 || !strings.Contains(r.poolJSON("cell-01"), "v1")) {
				t.Errorf("active %d after a poll past its deadline, want 1 still serving", r.a.Active())
			}
		})
	}
}
