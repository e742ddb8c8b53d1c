// Package lease is the control plane's side of governed egress
// (docs/egress.md): it runs the election of an org's owner of a traffic
// class over the live members the store knows, takes, renews and
// releases the class's lease in the store, and checks a holder's fencing
// epoch before it sends. controlapi serves it on the edge-control API;
// only controlapi imports it.
package lease

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
	"cellvisor/egress"
)

// Options configure a Service.
type Options struct {
	// Store is the open database. Required.
	Store *store.Store
	// Lease is how long a lease lasts unless renewed (holders renew every
	// third of it), and the live window: an edge not seen for that long
	// is not a candidate. Required.
	Lease time.Duration
	// ReachWindow is how long an edge's reported probe of a destination
	// counts. Required.
	ReachWindow time.Duration
	// TouchInterval is how far the store's last-seen times may lag this
	// replica's sightings (how often they are written); zero for none.
	TouchInterval time.Duration
	// LastSeen is when this replica last saw an edge, not yet written to
	// the store (zero for never), or nil for none.
	LastSeen func(id string) time.Time
	// Logger, or nil for none.
	Logger *zap.Logger
	// Now is the clock, or nil for time.Now.
	Now func() time.Time
}

// Service elects egress owners and checks their fences.
type Service struct {
	o   Options
	st  *store.Store
	log *zap.Logger
}

// New checks o and fills its defaults.
func New(o Options) (*Service, error) {
	switch {
	case o.Store == nil:
		return nil, errors.New("lease: no store")
	case o.Lease <= 0:
		return nil, errors.New("lease: no lease duration")
	case o.ReachWindow <= 0:
		return nil, errors.New("lease: no reach window")
	}
	if o.LastSeen == nil {
		o.LastSeen = func(string) time.Time { return time.Time{} }
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{o: o, st: o.Store, log: o.Logger}, nil
}

// Elect runs the election for caller and class, re-resolving the live
// membership, and takes, renews or releases the lease as it decides: what
// edgeapi.PathEgressElect answers.
func (s *Service) Elect(ctx context.Context, caller string, class egress.Class, reachable bool) (edgeapi.ElectResponse, error) {
	now := s.o.Now()
	resp := edgeapi.ElectResponse{Class: string(class), Renew: s.o.Lease / 3}
	me, err := s.st.EgressEdge(ctx, caller)
	if err != nil {
		return resp, err
	}
	pol, err := s.st.EgressPolicyFor(ctx, me.Org, string(class))
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return resp, err
	}
	resp.Destination = pol.Destination
	cands, err := s.liveCandidates(ctx, me, class, pol.Destination, reachable, now)
	if err != nil {
		return resp, err
	}
	var cur *egress.Lease
	stored, err := s.st.ActiveLease(ctx, me.Org, string(class))
	switch {
	case err == nil:
		cur = &egress.Lease{Holder: stored.Holder, Epoch: stored.Epoch, ExpiresAt: stored.ExpiresAt}
	case !errors.Is(err, store.ErrNotFound):
		return resp, err
	}
	d := egress.Decide(egress.Input{
		Org: me.Org, Class: class, Caller: caller, Candidates: cands, Now: now, Lease: cur,
		Policy: egress.Policy{Destination: pol.Destination, Region: pol.Region,
			Require: edgeapi.Requirement{Region: pol.RequireRegion, Zone: pol.RequireZone}},
	})
	resp.Outcome, resp.Stage, resp.Reason, resp.Alone = d.Outcome, d.Stage, d.Reason, d.Alone
	log := s.log.With(zap.String("org", me.Org), zap.String("class", string(class)), zap.String("edge", caller))
	if d.Release {
		err := s.st.ReleaseLease(ctx, me.Org, string(class), caller, cur.Epoch, now)
		switch {
		case err == nil:
			log.Info("egress lease released: its holder no longer reaches the destination or meets the requirement", zap.Int64("epoch", cur.Epoch))
			cur = nil
		case !errors.Is(err, store.ErrLeaseLost):
			return resp, err
		}
	}
	if d.Outcome == egress.Race {
		l, reason, err := s.takeLease(ctx, me.Org, class, caller, d, cur, now)
		switch {
		case errors.Is(err, store.ErrLeaseHeld):
			resp.Outcome, resp.Stage, resp.Reason, resp.Alone = edgeapi.OutcomeDeferred, edgeapi.StageLeaseRace, egress.ReasonLostRace, false
			if stored, err = s.st.ActiveLease(ctx, me.Org, string(class)); err == nil {
				cur = &egress.Lease{Holder: stored.Holder, Epoch: stored.Epoch, ExpiresAt: stored.ExpiresAt}
			} else if !errors.Is(err, store.ErrNotFound) {
				return resp, err
			}
		case err != nil:
			return resp, err
		default:
			if reason == egress.ReasonWonLease || d.Supersede != nil {
				fields := []zap.Field{zap.Int64("epoch", l.Epoch), zap.Time("expires", l.ExpiresAt), zap.String("stage", d.Stage)}
				if d.Supersede != nil {
					fields = append(fields, zap.String("superseded", d.Supersede.Holder), zap.Int64("superseded_epoch", d.Supersede.Epoch))
				}
				log.Info("egress lease acquired", fields...)
			}
			resp.Outcome, resp.Reason = edgeapi.OutcomeElected, reason
			cur = &egress.Lease{Holder: l.Holder, Epoch: l.Epoch, ExpiresAt: l.ExpiresAt}
		}
	}
	if cur.Current(now) {
		resp.Holder = s.holderView(ctx, cur, cands)
	}
	log.Debug("egress election", zap.String("outcome", resp.Outcome), zap.String("stage", resp.Stage), zap.String("reason", resp.Reason))
	return resp, nil
}

// takeLease acquires, renews or takes over the lease for caller; it
// answers the reason to report when it holds it.
func (s *Service) takeLease(ctx context.Context, org string, class egress.Class, caller string, d egress.Decision, cur *egress.Lease,
	now time.Time) (store.Lease, string, error) {
	if d.Renew {
		l, err := s.st.RenewLease(ctx, org, string(class), caller, cur.Epoch, now, s.o.Lease)
		if err == nil {
			return l, d.Reason, nil
		}
		if !errors.Is(err, store.ErrLeaseLost) {
			return l, "", err
		}
		// Expired or ended between the read and the renewal: acquire.
	}
	var sup *store.Superseded
	if d.Supersede != nil {
		sup = &store.Superseded{Holder: d.Supersede.Holder, Epoch: d.Supersede.Epoch}
	}
	l, err := s.st.AcquireLease(ctx, org, string(class), caller, now, s.o.Lease, sup)
	reason := egress.ReasonWonLease
	if d.Alone {
		reason = egress.ReasonAlone
	}
	return l, reason, err
}

// liveCandidates are the caller's org's enrolled edges seen within the
// live window (the lease duration), by this replica's sightings not yet
// written too, the caller always among them, as the election's
// candidates: a member reaches the destination when its latest probe
// says so for this very destination, checked within the reach window
// (the store's query); the caller's word is its request's. The caller's
// own sighting is written when the stored one lags, for the other
// replicas.
func (s *Service) liveCandidates(ctx context.Context, me store.EgressEdge, class egress.Class, dest string, reachable bool,
	now time.Time) ([]egress.Candidate, error) {
	live := now.Add(-s.o.Lease)
	gs, err := s.st.EgressGroups(ctx, me.Org, string(class), dest, live.Add(-s.o.TouchInterval), live, now.Add(-s.o.ReachWindow))
	if err != nil {
		return nil, err
	}
	if me.LastSeen.Before(now.Add(-s.o.Lease / 4)) {
		if err := s.st.Touch(ctx, map[string]time.Time{me.ID: now}); err != nil {
			return nil, err
		}
	}
	n := 1
	for _, g := range gs {
		n += g.N
	}
	out := make([]egress.Candidate, 0, n)
	for _, g := range gs {
		for id := range g.IDs() {
			if id == me.ID || !g.Live && s.o.LastSeen(id).Before(live) {
				continue
			}
			out = append(out, egress.Candidate{EdgeID: id, Region: g.Region, Zone: g.Zone, Priority: g.Priority, CostTier: g.CostTier,
				Weight: g.Weight, Reachable: dest != "" && g.Reachable})
		}
	}
	return append(out, egress.Candidate{EdgeID: me.ID, Region: me.Region, Zone: me.Zone, Priority: me.Priority, CostTier: me.CostTier,
		Weight: me.Weight, Reachable: dest != "" && reachable}), nil
}

// holderView is the lease holder as a peer reaches it: with its intake
// when it is among the live candidates (nil: not known to be).
func (s *Service) holderView(ctx context.Context, l *egress.Lease, live []egress.Candidate) *edgeapi.Holder {
	h := &edgeapi.Holder{EdgeID: l.Holder, Epoch: l.Epoch, ExpiresAt: l.ExpiresAt}
	e, err := s.st.EgressEdge(ctx, l.Holder)
	if err != nil {
		return h
	}
	// Not live: still named, with where it was.
	h.Region = e.Region
	if slices.ContainsFunc(live, func(c egress.Candidate) bool { return c.EdgeID == l.Holder }) {
		h.IntakeURL = e.IntakeURL
	}
	return h
}

// Fence checks caller's lease: the refusal reason, empty when it holds.
func (s *Service) Fence(ctx context.Context, caller string, req edgeapi.FenceRequest) (string, *edgeapi.Holder, error) {
	now := s.o.Now()
	me, err := s.st.Edge(ctx, caller)
	if err != nil {
		return "", nil, err
	}
	l, err := s.st.ActiveLease(ctx, me.Org, req.Class)
	if errors.Is(err, store.ErrNotFound) {
		return egress.FenceNoLease, nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	cur := &egress.Lease{Holder: l.Holder, Epoch: l.Epoch, ExpiresAt: l.ExpiresAt}
	var h *edgeapi.Holder
	if cur.Current(now) {
		h = s.holderView(ctx, cur, nil)
	}
	switch {
	case l.Holder != caller:
		return egress.FenceNotHolder, h, nil
	case l.Epoch != req.Epoch:
		return egress.FenceStaleEpoch, h, nil
	case !cur.Current(now):
		return egress.FenceLeaseExpired, nil, nil
	}
	if req.Peer == "" {
		return "", nil, nil
	}
	p, err := s.st.Edge(ctx, req.Peer)
	if errors.Is(err, store.ErrNotFound) || (err == nil && p.Org != me.Org) {
		return egress.FencePeerNotInOrg, h, nil
	}
	if err != nil {
		return "", nil, err
	}
	seen := p.LastSeen
	if at := s.o.LastSeen(p.ID); at.After(seen) {
		seen = at
	}
	if !p.Enrolled() {
		return egress.FencePeerNotEnrolled, h, nil
	}
	if seen.Before(now.Add(-s.o.Lease)) {
		return egress.FencePeerNotLive, h, nil
	}
	return "", nil, nil
}
