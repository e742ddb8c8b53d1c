package activation

import (
	"errors"
	"time"

	"cellvisor/domain"
	"cellvisor/manifest"
)

// Outcomes of an activation, as Stats reports them: the ack statuses, and
// failed for one that stopped on a local error and is retried.
const (
	OutcomeApplied = manifest.AckApplied
	OutcomePartial = manifest.AckPartial
	OutcomeRefused = manifest.AckRefused
	OutcomeFailed  = "failed"
)

// Stats is what the activator did since the agent started, for metrics.
type Stats struct {
	// Last is the most recent activation, zero before the first.
	Last Activation
	// Outcomes counts activations by outcome; Refusals counts refusals by
	// reason class (RefusalClass), each refusal of a sequence once.
	Outcomes map[string]int64
	Refusals map[string]int64
	// LastSuccess is when a poll last ended without error (a refusal is not
	// an error: the source answered); zero before the first.
	LastSuccess time.Time
}

// Activation is one activation's outcome and how long it took, from the
// start of the poll that found it to its ack in the journal.
type Activation struct {
	Sequence int64
	Outcome  string
	At       time.Time
	Duration time.Duration
}

// refusalClasses name every refusal sentinel, in the order they are tested:
// a bounded set of label values.
var refusalClasses = []struct {
	err  error
	name string
}{
	{manifest.ErrSignature, "signature"},
	{manifest.ErrDigest, "digest"},
	{manifest.ErrSize, "size"},
	{manifest.ErrHeader, "header"},
	{manifest.ErrStale, "stale"},
	{manifest.ErrRevision, "revision"},
	{manifest.ErrDuplicate, "duplicate"},
	{manifest.ErrTooMany, "too_many"},
	{manifest.ErrTooLarge, "too_large"},
	{manifest.ErrSnapshot, "snapshot"},
	{domain.ErrInvalid, "domain_invalid"},
	{errUnknownPool, "unknown_pool"},
	{manifest.ErrInvalid, "invalid"},
}

// RefusalClasses lists every value RefusalClass returns.
func RefusalClasses() []string {
	out := make([]string, 0, len(refusalClasses)+1)
	for _, c := range refusalClasses {
		out = append(out, c.name)
	}
	return append(out, "other")
}

// RefusalClass names the kind of a refusal: one of RefusalClasses.
func RefusalClass(err error) string {
	for _, c := range refusalClasses {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "other"
}

// Stats returns a copy of the activator's counters.
func (a *Activator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Outcomes, s.Refusals = map[string]int64{}, map[string]int64{}
	for k, v := range a.stats.Outcomes {
		s.Outcomes[k] = v
	}
	for k, v := range a.stats.Refusals {
		s.Refusals[k] = v
	}
	return s
}

// begin marks the start of a poll that may activate something.
func (a *Activator) begin() {
	a.mu.Lock()
	a.pollStart = a.clock.Now()
	a.mu.Unlock()
}

// note records an activation's outcome.
func (a *Activator) note(seq int64, outcome string) {
	now := a.clock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stats.Outcomes == nil {
		a.stats.Outcomes = map[string]int64{}
	}
	a.stats.Outcomes[outcome]++
	a.stats.Last = Activation{Sequence: seq, Outcome: outcome, At: now, Duration: now.Sub(a.pollStart)}
}

// noteRefusal counts a refusal by its class.
func (a *Activator) noteRefusal(seq int64, why error) {
	a.mu.Lock()
	if a.stats.Refusals == nil {
		a.stats.Refusals = map[string]int64{}
	}
	a.stats.Refusals[RefusalClass(why)]++
	a.mu.Unlock()
	a.note(seq, OutcomeRefused)
}
