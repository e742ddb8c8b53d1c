package backoff

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"cellvisor/internal/clock"
)

func TestDelayGrowsToTheCap(t *testing.T) {
	// r = 1/2 puts a delay at its nominal value whenever the range is the
	// full [d/2, 3d/2], which makes growth readable.
	const half = 0.5
	ms := time.Millisecond
	tests := []struct {
		name          string
		initial, maxD time.Duration
		n             int
		r             float64
		want          time.Duration
	}{
		{"first failure waits about initial", 100 * ms, time.Second, 1, half, 100 * ms},
		{"second doubles", 100 * ms, time.Second, 2, half, 200 * ms},
		{"half doubles again", 100 * ms, time.Second, 3, half, 400 * ms},
		{"low end of the range is half", 100 * ms, time.Second, 3, 0, 200 * ms},
		{"below the cap the range reaches 3/2", 100 * ms, time.Second, 2, 0.9999999, 300 * ms},
		{"near the cap the range stops at the cap", 100 * ms, time.Second, 4, 0.9999999, time.Second},
		{"at the cap the low end is cap/2", 100 * ms, time.Second, 5, 0, 500 * ms},
		{"far past the cap the low end is still cap/2", 100 * ms, time.Second, 60, 0, 500 * ms},
		{"far past the cap the high end is the cap", 100 * ms, time.Second, 1000, 0.9999999, time.Second},
		{"a cap below initial is initial", time.Second, 100 * ms, 3, 0.9999999, time.Second},
		{"no initial, no delay", 0, time.Second, 3, 0.5, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Delay(tc.initial, tc.maxD, tc.n, tc.r)
			if d := got - tc.want; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("Delay(%s, %s, %d, %g) = %s, want %s", tc.initial, tc.maxD, tc.n, tc.r, got, tc.want)
			}
		})
	}
}

// TestCappedDelaysSpread is issue 11 §5: capped delays must not pile up on
// the cap, which is what made crash-looping cells restart in lockstep.
func TestCappedDelaysSpread(t *testing.T) {
	tests := []struct {
		name          string
		initial, maxD time.Duration
		failures      int // draws start after this many failures
	}{
		{"just at the cap", 100 * time.Millisecond, 800 * time.Millisecond, 4},
		{"well past the cap", 100 * time.Millisecond, time.Second, 20},
		{"far past the cap, where doubling would overflow", time.Millisecond, 2 * time.Minute, 200},
		{"cap equal to initial", time.Second, time.Second, 1},
	}
	const draws = 20000
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.failures)))
			b := &Backoff{Initial: tc.initial, Max: tc.maxD, Rand: rng.Float64}
			for range tc.failures - 1 {
				b.Next()
			}
			counts := map[time.Duration]int{}
			lo, hi := tc.maxD, time.Duration(0)
			for range draws {
				d := b.Next()
				counts[d]++
				lo, hi = min(lo, d), max(hi, d)
				if d > tc.maxD {
					t.Fatalf("delay %s above the cap %s", d, tc.maxD)
				}
				if d < tc.maxD/2 {
					t.Fatalf("delay %s below half the cap %s", d, tc.maxD)
				}
			}
			for d, n := range counts {
				if n > draws/100 {
					t.Errorf("%d of %d delays are exactly %s", n, draws, d)
				}
			}
			span := tc.maxD / 2
			if lo > tc.maxD/2+span/50 || hi < tc.maxD-span/50 {
				t.Errorf("delays span [%s, %s], want close to [%s, %s]", lo, hi, tc.maxD/2, tc.maxD)
			}
			if b.Failures() != tc.failures-1+draws {
				t.Errorf("failures = %d", b.Failures())
			}
		})
	}
}

func TestResetAfterSuccess(t *testing.T) {
	b := &Backoff{Initial: 10 * time.Millisecond, Max: time.Second, Rand: func() float64 { return 0 }}
	for range 10 {
		b.Next()
	}
	if got := b.Next(); got != 500*time.Millisecond {
		t.Fatalf("capped delay at r=0: %s, want 500ms", got)
	}
	b.Reset()
	if b.Failures() != 0 {
		t.Fatalf("failures after reset = %d", b.Failures())
	}
	if got := b.Next(); got != 5*time.Millisecond {
		t.Fatalf("first delay after reset at r=0: %s, want 5ms", got)
	}
	if got := b.Steady(); got != 5*time.Millisecond || b.Failures() != 1 {
		t.Fatalf("Steady = %s with %d failures, want 5ms without counting", got, b.Failures())
	}
}

func TestWaitUsesTheClockAndTheContext(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	b := &Backoff{Initial: time.Second, Max: time.Minute, Clock: fc, Rand: func() float64 { return 0 }}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx) }()
	if err := fc.AwaitWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fc.Advance(499 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v before its delay (500ms at r=0)", err)
	default:
	}
	fc.Advance(time.Millisecond)
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}

	wctx, wcancel := context.WithCancel(ctx)
	go func() { done <- b.Wait(wctx) }()
	if err := fc.AwaitWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wcancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Wait after cancel: %v, want context.Canceled", err)
	}
	if fc.Waiters() != 0 {
		t.Fatalf("%d timers left armed after Wait returned", fc.Waiters())
	}
}

func TestSleepReturnsAtOnceForNothingOrAnEndedContext(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	if err := Sleep(context.Background(), fc, 0); err != nil {
		t.Fatalf("Sleep 0: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, fc, time.Hour); err != context.Canceled {
		t.Fatalf("Sleep on an ended context: %v", err)
	}
	if fc.Waiters() != 0 {
		t.Fatal("a timer was armed for an ended context")
	}
}

// Under a millisecond the real clock sleeps the thread, for at least d.
func TestSleepUnderAMillisecondOnTheRealClock(t *testing.T) {
	for _, c := range []clock.Clock{nil, clock.Real} {
		const d = 300 * time.Microsecond
		start := time.Now()
		if err := Sleep(context.Background(), c, d); err != nil {
			t.Fatalf("Sleep %v: %v", d, err)
		}
		if got := time.Since(start); got < d {
			t.Errorf("Sleep %v returned after %v", d, got)
		}
	}
}

// BenchmarkSleep measures what a short wait really costs on the real clock
// (ns/op): the thread sleep under a millisecond, and a Go timer, which
// waits at least a millisecond when the process is otherwise idle.
func BenchmarkSleep(b *testing.B) {
	const d = 200 * time.Microsecond
	b.Run("Sleep-200us", func(b *testing.B) {
		for b.Loop() {
			_ = Sleep(context.Background(), nil, d)
		}
	})
	b.Run("timer-200us", func(b *testing.B) {
		for b.Loop() {
			t := time.NewTimer(d)
			<-t.C
		}
	})
}
