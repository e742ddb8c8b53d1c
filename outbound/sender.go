package outbound

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/egress"
	"cellvisor/internal/backoff"
	"cellvisor/internal/clock"
)

// Control is the control API as the send path uses it (controlclient.Client).
type Control interface {
	// Elect runs the election cascade for this edge and class.
	Elect(ctx context.Context, r edgeapi.ElectRequest) (edgeapi.ElectResponse, error)
	// Fence returns nil while this edge holds the lease at r.Epoch (and
	// r.Peer is a live edge of its org), an error wrapping ErrStale when
	// the control API refused it, any other error when it could not ask.
	Fence(ctx context.Context, r edgeapi.FenceRequest) error
}

// ErrStale marks a refused fence: the lease is not held at that epoch (or
// the peer is refused). It is controlclient's ErrFenced.
var ErrStale = controlclient.ErrFenced

// Options configure a Sender.
type Options struct {
	// EdgeID and Org are this edge's. Required.
	EdgeID, Org string
	// Control is the control API. Required.
	Control Control
	// Journal holds the bundles until delivered. Required.
	Journal *Journal
	// Classes are the classes routed (and accepted at the intake); nil
	// means metering and siem_forwarding.
	Classes []egress.Class
	// TLS is the edges' mutual TLS for forwards; nil means no forwards:
	// a non-holder sends its bundles direct with epoch 0.
	TLS *PeerTLS
	// IntakeURL is this edge's intake as peers reach it (status), or empty.
	IntakeURL string
	// ProbeTimeout bounds a reachability probe of a destination (a TCP
	// connect); zero means 2s.
	ProbeTimeout time.Duration
	// SendTimeout bounds one send (to a destination or an intake); zero
	// means 10s.
	SendTimeout time.Duration
	// MaxRenew caps the wait between elections (an answer's Renew is used
	// when shorter); zero means 1m. Failures retry with backoff from
	// MinRetry (zero: 200ms) up to MaxRenew.
	MaxRenew, MinRetry time.Duration
	// IntakeConns bounds the intake's connections (IntakeLimits); zero
	// fields take their defaults.
	IntakeConns IntakeLimits
	// Logger, or nil for none.
	Logger *zap.Logger
	// Clock times elections, retries, fences' freshness, lease expiry and
	// the intake's memory of refused peers, or nil for the real clock.
	// (The intake's read deadline is the network stack's: real time.)
	Clock clock.Clock
}

// Sender runs the route table and delivers journaled bundles: one loop per
// class, which elects at the answer's Renew cadence and on failures, and
// sends every pending bundle of the class along its route.
type Sender struct {
	o    Options
	log  *zap.Logger
	clk  clock.Clock
	dest *http.Client
	wake map[string]chan struct{}
	// intake counts the intake's answers (atomics).
	intake intakeStats

	mu      sync.Mutex      // guards the following fields
	reelect map[string]bool // elect before the next delivery
	routes  map[string]*classState
	fwd     map[string]*http.Client // by holder edge id
	intakeE string                  // why the intake does not listen
}

type classState struct {
	route                       route
	reach                       *edgeapi.ReachReport
	lastErr                     string
	direct, forwarded, fallback int64
}

// NewSender checks the options and prepares the route table.
func NewSender(o Options) (*Sender, error) {
	if o.EdgeID == "" || o.Org == "" || o.Control == nil || o.Journal == nil {
		return nil, errors.New("outbound: EdgeID, Org, Control and Journal are required")
	}
	if o.Classes == nil {
		o.Classes = []egress.Class{egress.Metering, egress.SIEMForwarding}
	}
	for _, c := range o.Classes {
		if !c.Valid() {
			return nil, fmt.Errorf("outbound: unknown class %q", c)
		}
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = 2 * time.Second
	}
	if o.SendTimeout <= 0 {
		o.SendTimeout = 10 * time.Second
	}
	if o.MaxRenew <= 0 {
		o.MaxRenew = time.Minute
	}
	if o.MinRetry <= 0 {
		o.MinRetry = 200 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	s := &Sender{o: o, log: o.Logger.Named("egress"), clk: clock.Or(o.Clock), wake: map[string]chan struct{}{}, reelect: map[string]bool{}, routes: map[string]*classState{}, fwd: map[string]*http.Client{},
		dest: &http.Client{Timeout: o.SendTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	for _, c := range o.Classes {
		s.wake[string(c)] = make(chan struct{}, 1)
		s.routes[string(c)] = &classState{route: route{mode: edgeapi.RouteUnknown}}
	}
	return s, nil
}

// Routes reports whether class is routed by this sender.
func (s *Sender) Routes(class string) bool { _, ok := s.wake[class]; return ok }

// Submit journals a new bundle and wakes its class's loop.
func (s *Sender) Submit(b edgeapi.Bundle) error {
	if !s.Routes(b.Class) {
		return fmt.Errorf("%w: class %q is not routed here", ErrInvalidBundle, b.Class)
	}
	if err := s.o.Journal.Put(b); err != nil {
		return err
	}
	s.log.Debug("bundle journaled", zap.String("class", b.Class), zap.String("bundle", b.ID))
	s.Wake(b.Class)
	return nil
}

// Wake makes class's loop look at its journal now.
func (s *Sender) Wake(class string) {
	select {
	case s.wake[class] <- struct{}{}:
	default:
	}
}

// Reelect makes class's loop ask the control API again now: a peer
// forwarded to this edge as if it held the lease, or a test wants the
// route current.
func (s *Sender) Reelect(class string) {
	if !s.Routes(class) {
		return
	}
	s.mu.Lock()
	s.reelect[class] = true
	s.mu.Unlock()
	s.Wake(class)
}

// Run runs one loop per class until ctx ends.
func (s *Sender) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, c := range s.o.Classes {
		wg.Add(1)
		go func() { defer wg.Done(); s.runClass(ctx, string(c)) }()
	}
	wg.Wait()
	s.mu.Lock()
	for _, hc := range s.fwd {
		hc.CloseIdleConnections()
	}
	s.mu.Unlock()
	s.dest.CloseIdleConnections()
}

// runClass elects when due (or when a send found the route wrong), then
// delivers the class's pending bundles, then waits for the next election,
// a retry, a new bundle or the end.
func (s *Sender) runClass(ctx context.Context, class string) {
	b := &backoff.Backoff{Initial: s.o.MinRetry, Max: s.o.MaxRenew}
	var next time.Time // next election; zero: now
	var retry time.Duration
	for {
		s.mu.Lock()
		if s.reelect[class] {
			s.reelect[class], next = false, time.Time{}
		}
		s.mu.Unlock()
		if next.IsZero() || !s.clk.Now().Before(next) {
			// The next election is timed from this one's start: the
			// lease runs from when the control API handled it, and a slow
			// answer must not push the renewal past the expiry.
			start := s.clk.Now()
			renew, err := s.elect(ctx, class)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				s.fail(class, err)
				next = s.clk.Now().Add(b.Next())
			} else {
				next = start.Add(renew)
			}
		}
		err := s.deliver(ctx, class, next)
		if ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, errReelect):
			next, retry = time.Time{}, 0
			continue
		case errors.Is(err, errElectDue):
			continue // renew first, then deliver the rest
		case err != nil:
			s.fail(class, err)
			retry = b.Next()
		default:
			retry = 0
			b.Reset()
		}
		wait := next.Sub(s.clk.Now())
		if retry > 0 && retry < wait {
			wait = retry
		}
		t := s.clk.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.wake[class]:
		case <-t.C():
		}
		t.Stop()
	}
}

func (s *Sender) fail(class string, err error) {
	s.log.Warn("egress", zap.String("class", class), zap.Error(err))
	s.mu.Lock()
	s.routes[class].lastErr = err.Error()
	s.mu.Unlock()
}

// The route of an edge whose identity the control API refuses (401, 403:
// the edge was deleted, or its identity rotated away): refused, at this
// stage, for this reason. It sends nothing, not even direct: its bundles
// stay journaled until the control API takes it again (re-enrolled).
const (
	stageIdentity     = "identity"
	reasonEdgeRefused = "edge_refused"
)

// identityRefused reports a control API answer that refuses this edge's
// identity itself: 401 or 403.
func identityRefused(err error) bool {
	var he *controlclient.HTTPError
	return errors.As(err, &he) && (he.Status == http.StatusUnauthorized || he.Status == http.StatusForbidden)
}

// refusedIdentity turns class's route refused after err, an answer of the
// control API refusing this edge's identity.
func (s *Sender) refusedIdentity(class string, err error) {
	s.mu.Lock()
	cs := s.routes[class]
	prev := cs.route
	cs.route = route{mode: edgeapi.RouteRefused, stage: stageIdentity, reason: reasonEdgeRefused, destination: prev.destination, at: s.clk.Now(), renew: prev.renew}
	cs.lastErr = err.Error()
	s.mu.Unlock()
	if prev.mode != edgeapi.RouteRefused || prev.stage != stageIdentity {
		s.log.Error("the control API refuses this edge's identity (deleted, or rotated away): sending nothing of the class until it takes it again",
			zap.String("class", class), zap.String("was", prev.mode), zap.Error(err))
	}
}

// errReelect asks the class's loop to elect again at once: the lease this
// edge sent under is stale, or the holder it forwarded to failed.
var errReelect = errors.New("route changed: elect again")

// errElectDue stops a delivery run when the class's next election is due:
// a holder busy delivering a backlog (its peers' forwards keep coming)
// must still renew its lease at the cadence, or the lease expires under
// it and every fence fails.
var errElectDue = errors.New("election due")

// elect probes the class's destination, asks the control API and records
// the route; it returns when to ask again. A destination first learnt (or
// changed) from the answer is probed and the question asked again, so
// that the control API sees a fresh probe.
func (s *Sender) elect(ctx context.Context, class string) (time.Duration, error) {
	var resp edgeapi.ElectResponse
	for range 2 {
		s.mu.Lock()
		dest := s.routes[class].route.destination
		s.mu.Unlock()
		reachable := false
		if dest != "" {
			reachable = s.probe(ctx, class, dest)
		}
		var err error
		asked := s.clk.Now()
		resp, err = s.o.Control.Elect(ctx, edgeapi.ElectRequest{Class: class, Reachable: reachable})
		if identityRefused(err) {
			s.refusedIdentity(class, err)
		}
		if err != nil {
			return 0, fmt.Errorf("elect %s: %w", class, err)
		}
		s.log.Debug("egress election", zap.String("class", class), zap.Bool("reachable", reachable), zap.String("outcome", resp.Outcome),
			zap.String("reason", resp.Reason), zap.Duration("took", s.clk.Since(asked)))
		rt := routeFrom(resp, s.o.EdgeID, s.clk.Now())
		s.mu.Lock()
		prev := s.routes[class].route
		s.routes[class].route = rt
		s.mu.Unlock()
		if prev.mode != rt.mode || prev.holder != rt.holder || prev.epoch != rt.epoch {
			s.log.Info("egress route", zap.String("class", class), zap.String("route", rt.mode), zap.String("holder", rt.holder),
				zap.Int64("epoch", rt.epoch), zap.String("stage", rt.stage), zap.String("reason", rt.reason))
		}
		if rt.destination == dest {
			break
		}
	}
	renew := resp.Renew
	if renew <= 0 || renew > s.o.MaxRenew {
		renew = s.o.MaxRenew
	}
	s.mu.Lock()
	unknown := s.routes[class].route.mode == edgeapi.RouteUnknown
	s.mu.Unlock()
	if unknown {
		// Deferred while nobody holds the lease: the top-ranked candidate
		// is about to take it; ask again soon rather than at Renew.
		renew = min(renew, time.Second)
	}
	return max(renew, s.o.MinRetry), nil
}

// probe connects to the destination's host and port (TCP, ProbeTimeout)
// and records what it found.
func (s *Sender) probe(ctx context.Context, class, dest string) bool {
	ok := false
	if addr, err := hostPort(dest); err == nil {
		pctx, cancel := context.WithTimeout(ctx, s.o.ProbeTimeout)
		c, err := (&net.Dialer{}).DialContext(pctx, "tcp", addr)
		cancel()
		if err == nil {
			c.Close()
			ok = true
		}
	}
	s.mu.Lock()
	s.routes[class].reach = &edgeapi.ReachReport{Destination: dest, Reachable: ok, CheckedAt: s.clk.Now().UTC()}
	s.mu.Unlock()
	return ok
}

func hostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("destination %q: want an http(s) URL", raw)
	}
	if u.Port() != "" {
		return u.Host, nil
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// deliver sends the class's pending bundles, oldest first, along the
// current route; it stops at the first failure (errReelect when the route
// proved wrong), and before its second or later bundle once the election
// at due is due (errElectDue).
func (s *Sender) deliver(ctx context.Context, class string, due time.Time) error {
	for i, b := range s.o.Journal.Pending(class) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// At least one bundle a run: an election slower than the
		// cadence must not starve the deliveries either.
		if i > 0 && !due.IsZero() && !s.clk.Now().Before(due) {
			return errElectDue
		}
		s.mu.Lock()
		rt := s.routes[class].route
		s.mu.Unlock()
		var how *int64
		var path string
		var after error // delivered, then asks for an election
		switch rt.mode {
		case edgeapi.RouteRefused, edgeapi.RouteUnknown:
			return nil // journaled; the next election may route it
		case edgeapi.RouteDirect:
			if err := s.sendDirect(ctx, rt, b); err != nil {
				return err
			}
			how, path = &s.routes[class].direct, "direct"
		case edgeapi.RouteProxy:
			how, path = &s.routes[class].forwarded, "forwarded"
			ferr := s.forward(ctx, rt, b)
			var ie *intakeError
			if errors.As(ferr, &ie) && ie.code == http.StatusForbidden {
				// The control API refused this edge as the holder's peer
				// (deleted, rotated away): not a failure of the holder, so
				// no direct send; the bundle stays journaled and the next
				// election says what this edge may do.
				s.mu.Lock()
				s.reelect[class] = true
				s.mu.Unlock()
				return fmt.Errorf("forward %s bundle %s: this edge refused as a peer: %w", class, b.ID, ferr)
			}
			if ferr != nil {
				// The holder is unreachable or refused (stale lease, not
				// holder): deliver it ourselves rather than lose it, and
				// elect again for the next bundles.
				s.log.Warn("forward to holder failed; sending direct", zap.String("class", class), zap.String("holder", rt.holder), zap.String("bundle", b.ID), zap.Error(ferr))
				s.setErr(class, ferr)
				if err := s.post(ctx, rt.destination, b, 0); err != nil {
					return err
				}
				how, path, after = &s.routes[class].fallback, "fallback", errReelect
			}
		}
		s.mu.Lock()
		*how++ // delivered, whether or not its file goes at once
		s.mu.Unlock()
		s.log.Debug("bundle delivered", zap.String("class", class), zap.String("bundle", b.ID), zap.String("path", path),
			zap.Int64("epoch", rt.epoch), zap.String("holder", rt.holder))
		if err := s.o.Journal.Remove(b.ID); err != nil {
			return err
		}
		if after != nil {
			return after
		}
	}
	return nil
}

func (s *Sender) setErr(class string, err error) {
	s.mu.Lock()
	s.routes[class].lastErr = err.Error()
	s.mu.Unlock()
}

// sendDirect delivers b to the destination. A holder fences first, so
// that a holder frozen past its lease never sends under a stale epoch: a
// refused fence marks the route unknown and asks for an election.
//
// The fence's answer must be fresh when the bundle goes: asked less than
// half the renewal cadence (a sixth of the lease) before. A holder frozen
// (SIGSTOP, a VM paused) or starved between its fence and its send wakes
// with an old answer, during which a successor may have taken the lease:
// it fences again instead of committing under a stale epoch.
func (s *Sender) sendDirect(ctx context.Context, rt route, b edgeapi.Bundle) error {
	if rt.holds() {
		if err := s.fence(ctx, rt, b); err != nil {
			return err
		}
	}
	return s.post(ctx, rt.destination, b, rt.epoch)
}

// maxFences bounds the fences of one send whose answers came too late to
// trust.
const maxFences = 3

// fence asks the control API whether this edge holds b's class's lease at
// rt's epoch, until an answer is fresh (nil); a refusal marks the route
// unknown and asks for an election (errReelect).
func (s *Sender) fence(ctx context.Context, rt route, b edgeapi.Bundle) error {
	fresh := rt.renew / 2
	if fresh <= 0 {
		fresh = s.o.MaxRenew / 2
	}
	for range maxFences {
		asked := s.clk.Now()
		err := s.o.Control.Fence(ctx, edgeapi.FenceRequest{Class: b.Class, Epoch: rt.epoch})
		if err == nil && s.clk.Since(asked) <= fresh {
			return nil
		}
		if err == nil {
			s.log.Warn("fence answered too late to send under: asking again", zap.String("class", b.Class), zap.Int64("epoch", rt.epoch),
				zap.Duration("took", s.clk.Since(asked)), zap.Duration("fresh", fresh))
			continue
		}
		if identityRefused(err) {
			s.refusedIdentity(b.Class, err)
			return fmt.Errorf("fence %s epoch %d: %w", b.Class, rt.epoch, err)
		}
		if errors.Is(err, ErrStale) {
			s.mu.Lock()
			if cs := s.routes[b.Class]; cs.route.epoch == rt.epoch {
				cs.route.mode, cs.route.reason = edgeapi.RouteUnknown, "lease stale at epoch "+strconv.FormatInt(rt.epoch, 10)
				cs.lastErr = err.Error()
			}
			s.mu.Unlock()
			s.log.Warn("lease stale: not sending under it", zap.String("class", b.Class), zap.Int64("epoch", rt.epoch), zap.Error(err))
			return fmt.Errorf("%w: fence %s epoch %d: %w", errReelect, b.Class, rt.epoch, err)
		}
		return fmt.Errorf("fence %s epoch %d: %w", b.Class, rt.epoch, err)
	}
	return fmt.Errorf("fence %s epoch %d: %d answers came over %s after they were asked: not sending under them", b.Class, rt.epoch, maxFences, fresh)
}

// post delivers b to its destination: any 2xx is delivered.
func (s *Sender) post(ctx context.Context, dest string, b edgeapi.Bundle, epoch int64) error {
	if dest == "" {
		return fmt.Errorf("send %s bundle %s: no destination known", b.Class, b.ID)
	}
	h := http.Header{}
	h.Set(edgeapi.HeaderBundleID, b.ID)
	h.Set(edgeapi.HeaderEpoch, strconv.FormatInt(epoch, 10))
	h.Set(edgeapi.HeaderSender, s.o.EdgeID)
	code, msg, err := s.postJSON(ctx, s.dest, dest, h, b)
	if err != nil {
		return fmt.Errorf("send %s bundle %s to %s: %w", b.Class, b.ID, dest, err)
	}
	if code/100 != 2 {
		return fmt.Errorf("send %s bundle %s to %s: HTTP %d: %s", b.Class, b.ID, dest, code, msg)
	}
	return nil
}

// forward hands b to the holder's intake: delivered on 202 only.
func (s *Sender) forward(ctx context.Context, rt route, b edgeapi.Bundle) error {
	if s.o.TLS == nil || rt.holderURL == "" {
		return fmt.Errorf("holder %s has no intake this edge can reach", rt.holder)
	}
	hc := s.forwarder(rt.holder)
	code, msg, err := s.postJSON(ctx, hc, strings.TrimRight(rt.holderURL, "/")+edgeapi.PathIntake+b.Class, nil, b)
	if err != nil {
		return fmt.Errorf("forward to %s: %w", rt.holder, err)
	}
	if code != http.StatusAccepted {
		return &intakeError{holder: rt.holder, code: code, msg: msg}
	}
	return nil
}

// intakeError is an intake's answer other than 202.
type intakeError struct {
	holder string
	code   int
	msg    string
}

func (e *intakeError) Error() string {
	return fmt.Sprintf("forward to %s: HTTP %d: %s", e.holder, e.code, e.msg)
}

func (s *Sender) forwarder(holder string) *http.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if hc, ok := s.fwd[holder]; ok {
		return hc
	}
	tr := &http.Transport{
		TLSClientConfig:     s.o.TLS.ClientConfig(holder),
		DialContext:         (&net.Dialer{Timeout: s.o.ProbeTimeout}).DialContext,
		TLSHandshakeTimeout: s.o.ProbeTimeout,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     30 * time.Second,
	}
	hc := &http.Client{Transport: tr, Timeout: s.o.SendTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	s.fwd[holder] = hc
	return hc
}

func (s *Sender) postJSON(ctx context.Context, hc *http.Client, u string, h http.Header, b edgeapi.Bundle) (int, string, error) {
	data, err := json.Marshal(b)
	if err != nil {
		return 0, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.SendTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(data))
	if err != nil {
		return 0, "", err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, strings.TrimSpace(string(msg)), nil
}

// holderRoute is class's route when this edge holds its lease.
func (s *Sender) holderRoute(class string) (route, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs, ok := s.routes[class]
	if !ok || !cs.route.holds() {
		return route{}, false
	}
	return cs.route, true
}

// SetIntakeError records why the intake does not listen (status).
func (s *Sender) SetIntakeError(err error) {
	s.mu.Lock()
	s.intakeE = err.Error()
	s.mu.Unlock()
}

// Status reports the route table, the probes and the journal.
func (s *Sender) Status() *edgeapi.EgressStatus {
	j := s.o.Journal
	st := &edgeapi.EgressStatus{EgressReport: edgeapi.EgressReport{IntakeURL: s.o.IntakeURL, Reach: map[string]edgeapi.ReachReport{}},
		Org: s.o.Org, Journal: j.Status()}
	pending := map[string]int{}
	for _, c := range s.o.Classes {
		pending[string(c)] = len(j.Pending(string(c)))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st.Error = s.intakeE
	now := s.clk.Now()
	for _, c := range s.o.Classes {
		cs := s.routes[string(c)]
		rt := cs.route
		if rt.holds() && !rt.expires.IsZero() && !now.Before(rt.expires) {
			// A holder cut off from the control API: its lease ran out
			// without a renewal, and another edge may hold it now. It
			// sends nothing under the stale epoch (sendDirect fences
			// first); it must not say it holds the lease either.
			rt.mode, rt.reason = edgeapi.RouteUnknown, fmt.Sprintf("lease expired at %s without a renewal (the control API cannot be reached?)", rt.expires.UTC().Format(time.RFC3339))
		}
		rs := edgeapi.RouteStatus{Class: string(c), Route: rt.mode, Stage: rt.stage, Reason: rt.reason, Alone: rt.alone,
			Holder: rt.holder, HolderURL: rt.holderURL, Epoch: rt.epoch, Destination: rt.destination,
			Pending: pending[string(c)], Direct: cs.direct, Forwarded: cs.forwarded, Fallback: cs.fallback, LastError: cs.lastErr}
		if !rt.expires.IsZero() {
			e := rt.expires
			rs.Expires = &e
		}
		if !rt.at.IsZero() {
			a := rt.at
			rs.ElectedAt = &a
		}
		st.Routes = append(st.Routes, rs)
		if cs.reach != nil {
			st.Reach[string(c)] = *cs.reach
		}
	}
	return st
}
