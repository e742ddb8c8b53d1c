// Package backoff is the one retry delay of the agent: exponential growth
// from an initial delay up to a cap, then ±50% jitter kept within the cap,
// reset on success, waited on an injected clock and bounded by a context.
// Every retry and poll loop of the agent uses it, so that one jitter rule
// holds everywhere (issue 11 §5); the control API's store uses it too.
// Any package may import it.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"golang.org/x/sys/unix"

	"cellvisor/internal/clock"
)

// Backoff counts consecutive failures and says how long to wait after each.
// The zero value is not usable: set Initial and Max. A Backoff belongs to one
// loop; it is not safe for concurrent use.
type Backoff struct {
	// Initial is the delay after the first failure, and the nominal delay of
	// a loop that succeeds (Steady). Required, > 0.
	Initial time.Duration
	// Max caps every delay, jitter included; below Initial it is Initial.
	Max time.Duration
	// Clock times the waits, or nil for the real clock.
	Clock clock.Clock
	// Rand returns values in [0,1) for the jitter, or nil for math/rand/v2.
	Rand func() float64

	failures int
}

// Failures returns the consecutive failures since the last Reset.
func (b *Backoff) Failures() int { return b.failures }

// Next records a failure and returns the delay before the next attempt:
// Initial after the first, doubling after each further one, capped, jittered.
func (b *Backoff) Next() time.Duration {
	b.failures++
	return Delay(b.Initial, b.Max, b.failures, b.rand())
}

// Steady returns the jittered Initial without counting a failure: the wait
// of a loop after an attempt that succeeded.
func (b *Backoff) Steady() time.Duration { return Delay(b.Initial, b.Max, 1, b.rand()) }

// Reset forgets the failures: the next failure waits Initial again.
func (b *Backoff) Reset() { b.failures = 0 }

// Wait records a failure and waits its delay; it returns ctx's error if ctx
// ends first.
func (b *Backoff) Wait(ctx context.Context) error { return Sleep(ctx, b.Clock, b.Next()) }

func (b *Backoff) rand() float64 {
	if b.Rand != nil {
		return b.Rand()
	}
	return rand.Float64()
}

// Delay is the rule, pure: after n consecutive failures (n ≥ 1) the nominal
// delay is d = min(initial·2^(n-1), max); the delay is drawn uniformly from
// [d/2, min(3d/2, max)] by r in [0,1). Capping comes before the jitter, so
// delays at the cap spread over [max/2, max] instead of piling up on max, and
// no delay ever exceeds max: cells that crash together do not restart in
// lockstep.
func Delay(initial, maxDelay time.Duration, n int, r float64) time.Duration {
	if initial <= 0 {
		return 0
	}
	maxDelay = max(maxDelay, initial)
	d := initial
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	lo, hi := d/2, min(d+d/2, maxDelay)
	r = min(max(r, 0), 1)
	return lo + time.Duration(r*float64(hi-lo))
}

// Sleep waits d on c (nil: the real clock), or until ctx ends, in which case
// it returns ctx's error. A d ≤ 0 returns at once.
//
// On the real clock a d under a millisecond sleeps the calling thread
// instead (nanosleep), and ctx is checked only after it: Go's timers wake
// an otherwise idle process through epoll, whose timeout counts whole
// milliseconds, so a 200µs timer took 1.08 ms on this project's test host
// (BenchmarkSleep), and the cgroup kill loops, which wait 100–300µs between
// readings, waited a millisecond on a cell's crash path.
func Sleep(ctx context.Context, c clock.Clock, d time.Duration) error {
	if err := ctx.Err(); err != nil || d <= 0 {
		return err
	}
	if d < time.Millisecond && clock.Or(c) == clock.Real {
		ts := unix.NsecToTimespec(d.Nanoseconds())
		for {
			// A signal (the Go runtime's preemption) interrupts the sleep
			// and leaves what remains of it in ts.
			if err := unix.Nanosleep(&ts, &ts); err != unix.EINTR {
				break
			}
		}
		return ctx.Err()
	}
	t := clock.Or(c).NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}
