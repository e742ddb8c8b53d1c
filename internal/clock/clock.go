// Package clock is the time seam of the agent's loops and state machines:
// a Clock interface with the real one as default, and Fake, a manual clock
// for tests that must not depend on the wall clock. Any package may import
// it.
package clock

import "time"

// Clock tells the time and makes timers.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Since returns the time elapsed since t.
	Since(t time.Time) time.Duration
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker that fires every d (d > 0).
	NewTicker(d time.Duration) Ticker
}

// Timer is a time.Timer behind an interface.
type Timer interface {
	// C fires once when the timer expires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped it.
	Stop() bool
	// Reset changes the timer to expire after d.
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker behind an interface.
type Ticker interface {
	// C fires every period.
	C() <-chan time.Time
	// Stop turns the ticker off.
	Stop()
}

// Real is the system clock.
var Real Clock = realClock{}

// Or returns c, or Real when c is nil: what an Options field left nil means.
func Or(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

type realClock struct{}

func (realClock) Now() time.Time                  { return time.Now() }
func (realClock) Since(t time.Time) time.Duration { return time.Since(t) }
func (realClock) NewTimer(d time.Duration) Timer  { return realTimer{time.NewTimer(d)} }
func (realClock) NewTicker(d time.Duration) Ticker {
	return realTicker{time.NewTicker(d)}
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }
