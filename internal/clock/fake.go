package clock

import (
	"context"
	"sync"
	"time"
)

// Fake is a manual clock for tests: time moves only by Advance, and Waiters
// lets a test await a goroutine's timer (a condition, not a sleep).
type Fake struct {
	mu      sync.Mutex // guards the following fields
	now     time.Time
	waiters []*fakeTimer
	changed chan struct{} // closed and replaced whenever waiters change
}

var _ Clock = (*Fake)(nil)

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, changed: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Since returns the fake time elapsed since t.
func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

// NewTimer returns a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// NewTicker returns a ticker that fires every d of fake time.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1), period: d}
	t.Reset(d)
	return fakeTicker{t}
}

type fakeTicker struct{ t *fakeTimer }

func (t fakeTicker) C() <-chan time.Time { return t.t.c }
func (t fakeTicker) Stop()               { t.t.Stop() }

// Advance moves the fake time forward by d and fires every timer due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	kept := f.waiters[:0]
	for _, t := range f.waiters {
		if t.at.After(f.now) {
			kept = append(kept, t)
			continue
		}
		select {
		case t.c <- f.now:
		default: // a ticker nobody read: drop the tick, as time.Ticker does
		}
		if t.period > 0 {
			for !t.at.After(f.now) { // ticks missed in one Advance are dropped
				t.at = t.at.Add(t.period)
			}
			kept = append(kept, t)
		}
	}
	f.waiters = kept
	f.notifyLocked()
}

// Waiters returns how many timers and tickers are armed.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// AwaitWaiters blocks until at least n timers or tickers are armed, or ctx
// ends.
func (f *Fake) AwaitWaiters(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		got, ch := len(f.waiters), f.changed
		f.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *Fake) removeLocked(t *fakeTimer) bool {
	for i, w := range f.waiters {
		if w == t {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			f.notifyLocked()
			return true
		}
	}
	return false
}

type fakeTimer struct {
	f      *Fake
	c      chan time.Time
	at     time.Time     // guarded by f.mu
	period time.Duration // tickers only
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.f.removeLocked(t)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.f.removeLocked(t)
	t.at = t.f.now.Add(d)
	if d <= 0 && t.period == 0 {
		select {
		case t.c <- t.f.now:
		default:
		}
		t.f.notifyLocked()
		return was
	}
	t.f.waiters = append(t.f.waiters, t)
	t.f.notifyLocked()
	return was
}
