package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/atomicfile"
	"cellvisor/internal/backoff"
	"cellvisor/internal/safefile"
)

// Policy is the crash-restart policy.
type Policy struct {
	// Initial is the delay before the second consecutive restart; the first
	// restart after a healthy run is immediate.
	Initial time.Duration
	// Max caps the delay. A crash-looping cell is retried at Max forever
	// (jittered within [Max/2, Max], so cells crashing together spread out).
	Max time.Duration
	// HealthyAfter is how long a cell must have been ready for its next crash
	// to count as a first one again.
	HealthyAfter time.Duration
}

// tracker decides restarts from a cell's exits. It is pure: it is fed the
// ready duration of each run, holds no clock, and its jitter source is
// injected.
type tracker struct {
	p           Policy
	b           backoff.Backoff
	consecutive int
	// live, when set, is read at every exit: a policy reloaded while
	// the cell runs applies from its next exit.
	live func() Policy
}

// newTracker returns a tracker for p; rnd returns values in [0,1) for the
// jitter, or nil for math/rand.
func newTracker(p Policy, rnd func() float64) *tracker {
	return &tracker{p: p, b: backoff.Backoff{Initial: p.Initial, Max: p.Max, Rand: rnd}}
}

// setPolicy takes a reloaded policy for the exits and delays from now on,
// keeping the count of consecutive failures.
func (t *tracker) setPolicy(p Policy) {
	t.p = p
	t.b.Initial, t.b.Max = p.Initial, p.Max
}

// exit records an exit after a run that was ready for readyFor (0 if it
// never became ready, or never started).
func (t *tracker) exit(readyFor time.Duration) {
	if t.live != nil {
		if p := t.live(); p != t.p {
			t.setPolicy(p)
		}
	}
	if readyFor >= t.p.HealthyAfter {
		t.consecutive = 0
		t.b.Reset()
	}
	t.consecutive++
}

// Next says what follows the exits recorded: the first exit after a healthy
// run starts the cell again at once; each further one backs off, growing to
// the cap.
func (t *tracker) Next() (action, time.Duration) {
	if t.consecutive <= 1 {
		return actStart, 0
	}
	return actBackoff, t.b.Next()
}

// admit is the operator-restart rate limit, pure: at most limit restarts in
// any window. past are the restarts accepted before; it returns those still
// inside the window (with now added when admitted), and when refused how long
// until the next is allowed.
func admit(past []time.Time, now time.Time, limit int, window time.Duration) (kept []time.Time, retryIn time.Duration, ok bool) {
	for _, t := range past {
		if now.Sub(t) < window {
			kept = append(kept, t)
		}
	}
	if len(kept) >= limit {
		// Bounded by the window: an entry from a clock that was ahead does
		// not block restarts for longer.
		return kept, min(kept[0].Add(window).Sub(now), window), false
	}
	return append(kept, now), 0, true
}

// counters are a slot's restart counts and operator-restart times, kept
// across agent restarts.
type counters struct {
	Restarts             int         `json:"restarts"`
	OperatorRestarts     int         `json:"operator_restarts"`
	OperatorRestartTimes []time.Time `json:"operator_restart_times"`
}

func (c *slot) countersPath() string { return filepath.Join(c.spec.Dir, "supervision.json") }

// loadCounters resumes what a previous agent counted. Times further ahead
// than a window (a clock that was ahead, or a forged file) are dropped, so
// they cannot block restarts.
func (c *slot) loadCounters() {
	b, err := safefile.ReadFile(context.Background(), c.countersPath(), maxSmallFile)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var k counters
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		err = dec.Decode(&k)
	}
	if err == nil && (k.Restarts < 0 || k.OperatorRestarts < 0) {
		err = errors.New("negative count")
	}
	if err != nil {
		c.log.Warn("restart counts of a previous agent unreadable; starting from zero", zap.Error(err))
		return
	}
	now := c.s.clk.Now()
	var times []time.Time
	for _, t := range k.OperatorRestartTimes {
		if t.Sub(now) <= c.s.settings().RestartWindow && now.Sub(t) < c.s.settings().RestartWindow {
			times = append(times, t)
		}
	}
	if len(times) > c.s.settings().RestartLimit {
		times = times[len(times)-c.s.settings().RestartLimit:]
	}
	c.restarts, c.opRestartsTotal, c.opRestarts = k.Restarts, k.OperatorRestarts, times
}

// saveCounters persists the slot's counts; snapshots are taken and written
// in order under saveMu, so an older one never overwrites a newer one.
func (c *slot) saveCounters() {
	c.saveMu.Lock()
	defer c.saveMu.Unlock()
	c.mu.Lock()
	k := counters{Restarts: c.restarts, OperatorRestarts: c.opRestartsTotal, OperatorRestartTimes: slices.Clone(c.opRestarts)}
	c.mu.Unlock()
	b, err := json.Marshal(k)
	if err == nil {
		err = atomicfile.WriteFile(c.countersPath(), append(b, '\n'), 0o600)
	}
	if err != nil {
		c.log.Warn("persist restart counts", zap.Error(err))
	}
}
