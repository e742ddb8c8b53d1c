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

// cutSnapshot serves data, then holds the stream until the poll's
// deadline and ends it as end (a cut connection: an unexpected end of
// file; a stream that just stops: the end of file).
type cutSnapshot struct {
	*memSource
	data []byte
	end  error
}

func (s cutSnapshot) Snapshot(ctx context.Context) (io.ReadCloser, error) {
	return io.NopCloser(io.MultiReader(strings.NewReader(string(s.data)), ctxCut{ctx, s.end})), nil
}

type ctxCut struct {
	ctx context.Context
	end error
}

func (c ctxCut) Read([]byte) (int, error) {
	<-c.ctx.Done()
	return 0, c.end
}

// A snapshot download cut by the poll's deadline is a timeout, retried at
// the next poll: not a bad snapshot, refused and never asked for again.
func TestSnapshotCutByTheDeadlineIsNotARefusal(t *testing.T) {
	for _, tc := range []struct {
		name string
		half bool // else: a whole archive of the manifest alone
		end  error
	}{
		{"cut in the middle", true, io.ErrUnexpectedEOF},
		{"cut between files", false, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.publish(5, map[string]string{"a.example.com": "from snapshot"})
			var buf strings.Builder
			arts := r.src.artifacts
			if !tc.half {
				arts = nil // the stream stops where the artifacts were to come
			}
			if err := manifest.WriteSnapshot(&buf, manifest.Snapshot{Manifest: r.signed(), Artifacts: arts}); err != nil {
				t.Fatal(err)
			}
			data := []byte(buf.String())
			if tc.half {
				data = data[:len(data)/2]
			}
			r.a.o.Source = cutSnapshot{r.src, data, tc.end}
			r.a.o.PollTimeout = 200 * time.Millisecond
			err := r.a.Poll(context.Background())
			if err == nil || !strings.Contains(err.Error(), "poll_timeout") {
				t.Errorf("poll: %v, want the poll's deadline", err)
			}
			if p := r.j.Pending(); len(p) != 0 {
				t.Errorf("acks %+v after a cut download, want none", p)
			}
			r.a.mu.Lock()
			refused := r.a.snapshotRefused
			r.a.mu.Unlock()
			if refused {
				t.Error("a snapshot cut by the deadline is remembered as refused: the next poll will not ask for it")
			}
		})
	}
}
