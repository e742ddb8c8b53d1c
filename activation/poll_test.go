package activation

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"cellvisor/manifest"
)

// flakySource fails its first polls, and records when each poll came.
type flakySource struct {
	*memSource
	failFirst int
	polls     []time.Time
	enough    int
	done      chan struct{}
}

func (s *flakySource) Page(ctx context.Context, after int64, cursor string) (manifest.Page, error) {
	if cursor == "" {
		s.polls = append(s.polls, time.Now())
		if len(s.polls) == s.enough {
			close(s.done)
		}
		if len(s.polls) <= s.failFirst {
			return manifest.Page{}, errors.New("connection refused")
		}
	}
	return s.memSource.Page(ctx, after, cursor)
}

// TestRunBacksOffAndResets runs the poll loop in a synctest bubble, whose
// clock moves only when every goroutine waits: while the source fails, the
// gaps between polls grow from the interval to the cap, jittered within
// ±50% and never above the cap; after a success they are the interval again.
func TestRunBacksOffAndResets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.publish(1, map[string]string{"a.example.com": "one"})
		src := &flakySource{memSource: r.src, failFirst: 6, enough: 10, done: make(chan struct{})}
		o := r.a.o
		o.Source = src
		a, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		const interval, maxDelay = time.Second, 8 * time.Second
		ctx, cancel := context.WithCancel(t.Context())
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			a.Run(ctx, interval, maxDelay)
		}()
		<-src.done
		cancel()
		<-stopped
		if a.Active() != 1 {
			t.Errorf("active %d after the source came back, want 1", a.Active())
		}
		// Nominal gaps: 1, 2, 4, 8, 8, 8 s while failing, then 1 s.
		nominal := []time.Duration{1, 2, 4, 8, 8, 8, 1, 1, 1}
		for i := 1; i < len(src.polls); i++ {
			d := nominal[i-1] * time.Second
			lo, hi := d/2, min(d+d/2, maxDelay)
			if gap := src.polls[i].Sub(src.polls[i-1]); gap < lo || gap > hi {
				t.Errorf("gap before poll %d: %s, want within [%s, %s]", i+1, gap, lo, hi)
			}
		}
	})
}
