package supervisor

import (
	"testing"
	"time"
)

func TestTrackerDelays(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, HealthyAfter: 30 * time.Second}
	tests := []struct {
		name     string
		readyFor []time.Duration
		want     []time.Duration
	}{
		{"first restart is immediate, then doubling to the cap", []time.Duration{0, 0, 0, 0, 0, 0, 0},
			[]time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}},
		{"a healthy run resets the backoff", []time.Duration{0, 0, 0, time.Minute, 0},
			[]time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 0, 100 * time.Millisecond}},
		{"a short ready run does not reset", []time.Duration{0, time.Second, 29 * time.Second},
			[]time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond}},
		{"a crash loop keeps retrying at the cap forever", make([]time.Duration, 100), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := tracker{p: p}
			for i, r := range tc.readyFor {
				got := tr.next(r)
				if tc.want != nil && got != tc.want[i] {
					t.Errorf("exit %d: delay %s, want %s", i+1, got, tc.want[i])
				}
				if tc.want == nil && i > 10 && got != p.Max {
					t.Errorf("exit %d: delay %s, want the cap %s", i+1, got, p.Max)
				}
			}
		})
	}
}

func TestTrackerJitterStaysInBoundsAndUnderCap(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, HealthyAfter: time.Minute}
	for _, j := range []float64{0, 0.5, 0.999} {
		tr := tracker{p: p, jitter: func() float64 { return j }}
		tr.next(0)
		got := tr.next(0) // nominal 100ms
		want := time.Duration(float64(100*time.Millisecond) * (0.5 + j))
		if got != want {
			t.Errorf("jitter %g: %s, want %s", j, got, want)
		}
		for range 20 {
			if d := tr.next(0); d > p.Max {
				t.Fatalf("jitter %g: delay %s over the cap", j, d)
			}
		}
	}
}
