package supervisor

import (
	"math/rand/v2"
	"time"
)

// Policy is the crash-restart policy.
type Policy struct {
	// Initial is the delay before the second consecutive restart; the first
	// restart after a healthy run is immediate.
	Initial time.Duration
	// Max caps the delay. A crash-looping cell is retried at Max forever.
	Max time.Duration
	// HealthyAfter is how long a cell must have been ready for its next crash
	// to count as a first one again.
	HealthyAfter time.Duration
}

// tracker decides restart delays from a cell's exits. It is pure: it gets the
// ready duration of each run and a jitter source, and holds no clock.
type tracker struct {
	p           Policy
	consecutive int
	jitter      func() float64 // in [0,1); nil means none
}

// next records an exit after a run that was ready for readyFor (0 if it never
// became ready) and returns the delay before the next start.
func (t *tracker) next(readyFor time.Duration) time.Duration {
	if readyFor >= t.p.HealthyAfter {
		t.consecutive = 0
	}
	t.consecutive++
	if t.consecutive == 1 {
		return 0
	}
	d := t.p.Initial
	for i := 2; i < t.consecutive && d < t.p.Max; i++ {
		d *= 2
	}
	if t.jitter != nil {
		// ±50%, so cells that crashed together do not restart in lockstep.
		d = time.Duration(float64(d) * (0.5 + t.jitter()))
	}
	return min(d, t.p.Max)
}

func defaultJitter() float64 { return rand.Float64() }
