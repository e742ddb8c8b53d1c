package systemd

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"cellvisor/internal/clock"
)

// ErrStale says a watched loop has not marked a heartbeat within its bound:
// it is stuck or gone, and the watchdog must not be pinged for it.
var ErrStale = errors.New("loop silent")

// Health is what the watchdog pings for: every watched long-running loop
// has marked a heartbeat recently. A loop marks one on every turn (the
// supervisor's monitor tick, the end of each activation poll); its bound is
// the longest gap a live loop can leave between two marks (its interval plus
// the longest bounded step it may be inside). A loop that has not marked one
// yet counts from Watch.
type Health struct {
	clk clock.Clock

	mu    sync.Mutex // guards the following fields
	loops []watched
}

type watched struct {
	name   string
	last   func() time.Time
	within time.Duration
	since  time.Time // when Watch was called: the grace of a loop not yet marked
}

// NewHealth returns a Health timed by clk, or by the real clock when nil.
func NewHealth(clk clock.Clock) *Health {
	return &Health{clk: clock.Or(clk)}
}

// Watch adds a loop: last returns the time of its latest heartbeat (zero
// until its first), within is the longest gap a live loop leaves. The times
// last returns must come from the same clock as h's.
func (h *Health) Watch(name string, last func() time.Time, within time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.loops = append(h.loops, watched{name: name, last: last, within: within, since: h.clk.Now()})
}

// Check returns nil while every watched loop's heartbeat is within its
// bound, and otherwise an ErrStale naming each silent loop and for how long.
func (h *Health) Check() error {
	h.mu.Lock()
	loops := append([]watched(nil), h.loops...)
	h.mu.Unlock()
	now := h.clk.Now()
	var stale []string
	for _, l := range loops {
		at := l.last()
		if at.IsZero() || at.Before(l.since) {
			at = l.since
		}
		if gap := now.Sub(at); gap > l.within {
			stale = append(stale, fmt.Sprintf("%s for %s (bound %s)", l.name, gap.Round(time.Second), l.within))
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("%w: %s", ErrStale, strings.Join(stale, ", "))
	}
	return nil
}
