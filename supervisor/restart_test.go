package supervisor

import (
	"testing"
	"time"

	"cellvisor/internal/backoff"
)

func TestTrackerDecisions(t *testing.T) {
	const r = 0.5 // the middle of the jitter range: the nominal delay below the cap
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, HealthyAfter: 30 * time.Second}
	ms := time.Millisecond
	type step struct {
		act   action
		delay time.Duration
	}
	now := step{actStart, 0}
	back := func(d time.Duration) step { return step{actBackoff, d} }
	capped := back(backoff.Delay(p.Initial, p.Max, 100, r)) // 750ms: the middle of [Max/2, Max]
	nearCap := back(700 * ms)                               // nominal 800ms: the middle of [400ms, Max]
	tests := []struct {
		name     string
		readyFor []time.Duration
		want     []step
	}{
		{"first restart is immediate, then doubling to the cap",
			[]time.Duration{0, 0, 0, 0, 0, 0, 0},
			[]step{now, back(100 * ms), back(200 * ms), back(400 * ms), nearCap, capped, capped}},
		{"a healthy run resets the backoff",
			[]time.Duration{0, 0, 0, time.Minute, 0},
			[]step{now, back(100 * ms), back(200 * ms), now, back(100 * ms)}},
		{"exactly HealthyAfter counts as healthy",
			[]time.Duration{0, 0, 30 * time.Second},
			[]step{now, back(100 * ms), now}},
		{"a short ready run does not reset",
			[]time.Duration{0, time.Second, 29 * time.Second},
			[]step{now, back(100 * ms), back(200 * ms)}},
		{"a cell that never became ready keeps backing off",
			[]time.Duration{0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			[]step{now, back(100 * ms), back(200 * ms), back(400 * ms), nearCap, capped, capped, capped, capped, capped}},
		{"a healthy first run is an immediate restart",
			[]time.Duration{time.Hour},
			[]step{now}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker(p, func() float64 { return r })
			for i, ready := range tc.readyFor {
				tr.exit(ready)
				act, d := tr.Next()
				if got := (step{act, d}); got != tc.want[i] {
					t.Errorf("exit %d: %s %s, want %s %s", i+1, act, d, tc.want[i].act, tc.want[i].delay)
				}
			}
		})
	}
}

// TestTrackerCrashLoopSpreadsUnderTheCap: cells crash-looping together get
// delays spread over [Max/2, Max], never above Max (issue 11 §5).
func TestTrackerCrashLoopSpreadsUnderTheCap(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, HealthyAfter: time.Minute}
	tr := newTracker(p, nil)
	seen := map[time.Duration]int{}
	for i := range 2000 {
		tr.exit(0)
		_, d := tr.Next()
		if d > p.Max {
			t.Fatalf("exit %d: delay %s over the cap", i+1, d)
		}
		if i > 10 {
			if d < p.Max/2 {
				t.Fatalf("exit %d: capped delay %s under Max/2", i+1, d)
			}
			seen[d]++
		}
	}
	for d, n := range seen {
		if n > 20 {
			t.Errorf("%d capped delays are exactly %s: restarts would be in lockstep", n, d)
		}
	}
}

func TestAdmitRestart(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const window = 10 * time.Minute
	tests := []struct {
		name    string
		past    []time.Time
		now     time.Time
		limit   int
		ok      bool
		kept    int
		retryIn time.Duration
	}{
		{"none before", nil, at(0), 3, true, 1, 0},
		{"under the limit", []time.Time{at(0), at(time.Minute)}, at(2 * time.Minute), 3, true, 3, 0},
		{"at the limit inside the window", []time.Time{at(0), at(time.Minute), at(2 * time.Minute)}, at(3 * time.Minute), 3, false, 3, 7 * time.Minute},
		{"the oldest leaves the window", []time.Time{at(0), at(time.Minute), at(2 * time.Minute)}, at(window), 3, true, 3, 0},
		{"one second before the oldest leaves", []time.Time{at(0), at(time.Minute), at(2 * time.Minute)}, at(window - time.Second), 3, false, 3, time.Second},
		{"all old ones forgotten", []time.Time{at(0), at(time.Minute), at(2 * time.Minute)}, at(time.Hour), 3, true, 1, 0},
		{"a limit of one", []time.Time{at(0)}, at(time.Minute), 1, false, 1, 9 * time.Minute},
		{"a restart recorded ahead of a clock stepped back 60s still counts, its wait bounded by the window",
			[]time.Time{at(time.Minute)}, at(0), 1, false, 1, window},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kept, retryIn, ok := admit(tc.past, tc.now, tc.limit, window)
			if ok != tc.ok || len(kept) != tc.kept || retryIn != tc.retryIn {
				t.Errorf("admit = %d kept, retry in %s, ok %v; want %d, %s, %v", len(kept), retryIn, ok, tc.kept, tc.retryIn, tc.ok)
			}
			if ok && !kept[len(kept)-1].Equal(tc.now) {
				t.Errorf("admitted restart not recorded: %v", kept)
			}
		})
	}
}
