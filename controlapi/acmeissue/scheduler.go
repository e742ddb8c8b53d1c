package acmeissue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/backoff"
	"cellvisor/internal/clock"
)

// Domain is an ACME domain as the Scheduler sees it: its hostnames and the
// certificate it has now, if any.
type Domain struct {
	// Name is the domain document's name.
	Name string
	// Hostnames are the names its certificate must cover.
	Hostnames []string
	// NotBefore and NotAfter are its current certificate's validity, zero
	// when it has none.
	NotBefore, NotAfter time.Time
	// Covered lists the names its current certificate covers (its DNS
	// SANs); a hostname not covered makes the domain due at once.
	Covered []string
}

// Source lists the domains to keep certified.
type Source interface {
	// ACMEDomains returns every domain whose document asks for ACME.
	ACMEDomains(ctx context.Context) ([]Domain, error)
}

// Sink stores what was issued as the domain's certificate (encrypted at
// rest, published to its cells).
type Sink interface {
	Put(ctx context.Context, name string, c *Certificate) error
}

// Obtainer runs one order; *Issuer is one.
type Obtainer interface {
	Obtain(ctx context.Context, name string, hostnames []string) (*Certificate, error)
}

var _ Obtainer = (*Issuer)(nil)

// State is what the Scheduler knows of one domain: what status and the
// admin API report.
type State struct {
	Name string `json:"name"`
	// NotAfter is the current certificate's end, zero when none.
	NotAfter time.Time `json:"not_after,omitzero"`
	// NextAttempt is when the next order starts (the renewal time, or
	// the retry after a failure).
	NextAttempt time.Time `json:"next_attempt"`
	// Failures counts the orders failed since the last success.
	Failures int `json:"failures,omitempty"`
	// LastError is the last failure, with the CA's problems, or empty.
	LastError string    `json:"last_error,omitempty"`
	Problems  []Problem `json:"problems,omitempty"`
	// LastAttempt and LastSuccess are when an order last started and
	// last gave a certificate.
	LastAttempt time.Time `json:"last_attempt,omitzero"`
	LastSuccess time.Time `json:"last_success,omitzero"`
}

// SchedulerOptions configure a Scheduler.
type SchedulerOptions struct {
	// Source, Sink and Obtainer are required.
	Source   Source
	Sink     Sink
	Obtainer Obtainer
	// Clock times the schedule, or nil for the real clock.
	Clock clock.Clock
	// Logger, or nil for none.
	Logger *zap.Logger
	// MinBackoff and MaxBackoff bound the retry delay after failures
	// (doubling, ±50% jitter), or zero for 1 minute and 6 hours.
	MinBackoff, MaxBackoff time.Duration
	// Rescan is how often the domains are listed again when nothing is
	// due sooner, or zero for 1 minute. Kick lists them at once.
	Rescan time.Duration
	// AttemptTimeout bounds one order, or zero for 10 minutes.
	AttemptTimeout time.Duration
	// Rand returns values in [0,1) for the jitter, or nil for math/rand.
	Rand func() float64
	// Leader reports whether this replica orders now (one of several
	// sharing a database holds a lease), asked before every step and
	// every order; nil means always.
	Leader func(ctx context.Context) (bool, error)
}

// Scheduler keeps every ACME domain certified: it obtains a certificate for
// a domain that has none (or one that misses a hostname), renews at two
// thirds of the lifetime, and after a failure retries with backoff.
type Scheduler struct {
	o    SchedulerOptions
	clk  clock.Clock
	log  *zap.Logger
	kick chan struct{}

	mu    sync.Mutex // guards the following fields
	state map[string]*State
	// issued remembers the validity of what this Scheduler stored, so a
	// Source that lags behind the Sink does not trigger a second order.
	issued map[string]issued
}

// issued is a certificate this Scheduler stored and the names it covers.
type issued struct {
	notBefore, notAfter time.Time
	hostnames           []string
}

// NewScheduler checks o, fills its defaults and returns a Scheduler; Run
// starts it.
func NewScheduler(o SchedulerOptions) (*Scheduler, error) {
	if o.Source == nil || o.Sink == nil || o.Obtainer == nil {
		return nil, errors.New("acme scheduler: Source, Sink and Obtainer are required")
	}
	o.MinBackoff = cmpOr(o.MinBackoff, time.Minute)
	o.MaxBackoff = max(cmpOr(o.MaxBackoff, 6*time.Hour), o.MinBackoff)
	o.Rescan = cmpOr(o.Rescan, time.Minute)
	o.AttemptTimeout = cmpOr(o.AttemptTimeout, 10*time.Minute)
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Scheduler{
		o: o, clk: clock.Or(o.Clock), log: log.Named("acme"),
		kick:   make(chan struct{}, 1),
		state:  map[string]*State{},
		issued: map[string]issued{},
	}, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Kick has Run list the domains again now (a domain was published).
func (s *Scheduler) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Status returns every domain's state, by name.
func (s *Scheduler) Status() []State {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]State, 0, len(s.state))
	for _, st := range s.state {
		c := *st
		c.Problems = slices.Clone(st.Problems)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b State) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Run keeps the domains certified until ctx ends, one order at a time
// (CAs limit orders per account), and returns ctx's error.
func (s *Scheduler) Run(ctx context.Context) error {
	for {
		wait := s.step(ctx)
		t := s.clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		case <-s.kick:
			t.Stop()
		}
	}
}

// step lists the domains, runs the orders due and returns how long to wait
// before the next step.
func (s *Scheduler) step(ctx context.Context) time.Duration {
	if !s.lead(ctx) {
		return s.o.Rescan
	}
	doms, err := s.o.Source.ACMEDomains(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("acme domains not listed", zap.Error(err))
		}
		return s.o.Rescan
	}
	s.forget(doms)
	for _, d := range doms {
		if ctx.Err() != nil {
			return 0
		}
		now := s.clk.Now()
		if next := s.plan(now, d); !next.After(now) {
			if !s.lead(ctx) {
				return s.o.Rescan
			}
			s.attempt(ctx, d)
		}
	}
	now := s.clk.Now()
	wait := s.o.Rescan
	s.mu.Lock()
	for _, st := range s.state {
		wait = min(wait, max(st.NextAttempt.Sub(now), 0))
	}
	s.mu.Unlock()
	return wait
}

// lead asks Leader whether this replica orders now. A replica that does
// not forgets what it knew: the leader's status is the one that holds.
func (s *Scheduler) lead(ctx context.Context) bool {
	if s.o.Leader == nil {
		return true
	}
	ok, err := s.o.Leader(ctx)
	if err != nil && ctx.Err() == nil {
		s.log.Warn("acme lease not read", zap.Error(err))
	}
	if err != nil || !ok {
		s.mu.Lock()
		clear(s.state)
		clear(s.issued)
		s.mu.Unlock()
		return false
	}
	return true
}

// forget drops the state of domains no longer listed.
func (s *Scheduler) forget(doms []Domain) {
	listed := make(map[string]bool, len(doms))
	for _, d := range doms {
		listed[d.Name] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.state {
		if !listed[name] {
			delete(s.state, name)
			delete(s.issued, name)
		}
	}
}

// plan records when d's next order is due and returns it.
func (s *Scheduler) plan(now time.Time, d Domain) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state[d.Name]
	if st == nil {
		st = &State{Name: d.Name}
		s.state[d.Name] = st
	}
	if c, ok := s.issued[d.Name]; ok && c.notAfter.After(d.NotAfter) {
		d.NotBefore, d.NotAfter, d.Covered = c.notBefore, c.notAfter, c.hostnames
	}
	st.NotAfter = d.NotAfter
	if st.Failures == 0 {
		st.NextAttempt = RenewAt(now, d)
	}
	return st.NextAttempt
}

// RenewAt is the rule, pure: a domain with no certificate, or whose
// certificate misses one of its hostnames or has ended, is due now;
// otherwise at two thirds of its certificate's lifetime.
func RenewAt(now time.Time, d Domain) time.Time {
	if d.NotAfter.IsZero() || !d.NotAfter.After(now) {
		return now
	}
	for _, h := range d.Hostnames {
		if !covers(d.Covered, h) {
			return now
		}
	}
	return d.NotBefore.Add(d.NotAfter.Sub(d.NotBefore) * 2 / 3)
}

// covers reports whether names (a certificate's SANs) cover host, a
// wildcard covering one label.
func covers(names []string, host string) bool {
	for _, n := range names {
		if n == host {
			return true
		}
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			if _, parent, found := strings.Cut(host, "."); found && parent == rest {
				return true
			}
		}
	}
	return false
}

// attempt runs one order for d and records its outcome.
func (s *Scheduler) attempt(ctx context.Context, d Domain) {
	log := s.log.With(zap.String("domain", d.Name))
	start := s.clk.Now()
	s.mu.Lock()
	s.state[d.Name].LastAttempt = start
	s.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, s.o.AttemptTimeout)
	c, err := s.o.Obtainer.Obtain(actx, d.Name, d.Hostnames)
	if err == nil {
		if err = s.o.Sink.Put(actx, d.Name, c); err != nil {
			err = fmt.Errorf("store certificate: %w", err)
		}
	}
	cancel()
	if ctx.Err() != nil {
		return // shutting down: not the CA's failure
	}
	now := s.clk.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state[d.Name]
	if err != nil {
		st.Failures++
		st.LastError = err.Error()
		st.Problems = Problems(err)
		st.NextAttempt = now.Add(backoff.Delay(s.o.MinBackoff, s.o.MaxBackoff, st.Failures, s.o.Rand()))
		log.Warn("acme order failed", zap.Error(err), zap.Int("failures", st.Failures), zap.Time("next_attempt", st.NextAttempt))
		return
	}
	s.issued[d.Name] = issued{notBefore: c.NotBefore, notAfter: c.NotAfter, hostnames: slices.Clone(d.Hostnames)}
	st.Failures, st.LastError, st.Problems = 0, "", nil
	st.LastSuccess, st.NotAfter = now, c.NotAfter
	st.NextAttempt = RenewAt(now, Domain{Hostnames: d.Hostnames, Covered: d.Hostnames, NotBefore: c.NotBefore, NotAfter: c.NotAfter})
	log.Info("acme certificate stored", zap.Time("not_after", c.NotAfter), zap.Time("renew_at", st.NextAttempt))
}
