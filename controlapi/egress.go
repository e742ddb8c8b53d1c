package controlapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
	"cellvisor/egress"
)

// Egress lease bounds (docs/egress.md).
const (
	DefaultEgressLease = 2 * time.Minute
	MinEgressLease     = time.Second
	// MaxEgressLease keeps a dead holder's exit closed for minutes, not
	// an hour.
	MaxEgressLease = 10 * time.Minute
	// maxEgressURL bounds a destination or intake URL.
	maxEgressURL = 2048
)

func egressDefaults(o *Options) error {
	if o.EgressLease == 0 {
		o.EgressLease = DefaultEgressLease
	}
	if o.EgressLease < MinEgressLease || o.EgressLease > MaxEgressLease {
		return fmt.Errorf("controlapi: egress lease %s: want %s–%s", o.EgressLease, MinEgressLease, MaxEgressLease)
	}
	if o.EgressReachWindow <= 0 {
		// Unchanged status reports are written at least every
		// StatusRewrite (a probe's outcome changing is a change): a
		// live edge's stored probe is never older than that.
		o.EgressReachWindow = max(2*o.EgressLease, time.Minute, o.StatusRewrite+time.Minute)
	}
	return nil
}

// elect answers who owns (the caller's org, class), re-resolving the live
// membership, and takes or renews the lease when the caller should hold it.
func (s *Server) elect(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	var req edgeapi.ElectRequest
	if err := decode(r, edgeapi.MaxElectBytes, &req); err != nil {
		return err
	}
	class, err := egress.ParseClass(req.Class)
	if err != nil {
		return errorf(http.StatusBadRequest, "class: %v", err)
	}
	resp, err := s.Elect(r.Context(), st.ID, class, req.Reachable)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// Elect runs the election for caller and class: what PathEgressElect
// answers (exported for the benchmarks and the demo).
func (s *Server) Elect(ctx context.Context, caller string, class egress.Class, reachable bool) (edgeapi.ElectResponse, error) {
	now := s.o.Now()
	resp := edgeapi.ElectResponse{Class: string(class), Renew: s.o.EgressLease / 3}
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
func (s *Server) takeLease(ctx context.Context, org string, class egress.Class, caller string, d egress.Decision, cur *egress.Lease,
	now time.Time) (store.Lease, string, error) {
	if d.Renew {
		l, err := s.st.RenewLease(ctx, org, string(class), caller, cur.Epoch, now, s.o.EgressLease)
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
	l, err := s.st.AcquireLease(ctx, org, string(class), caller, now, s.o.EgressLease, sup)
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
func (s *Server) liveCandidates(ctx context.Context, me store.EgressEdge, class egress.Class, dest string, reachable bool,
	now time.Time) ([]egress.Candidate, error) {
	live := now.Add(-s.o.EgressLease)
	gs, err := s.st.EgressGroups(ctx, me.Org, string(class), dest, live.Add(-s.o.TouchInterval), live, now.Add(-s.o.EgressReachWindow))
	if err != nil {
		return nil, err
	}
	if me.LastSeen.Before(now.Add(-s.o.EgressLease / 4)) {
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
			if id == me.ID || !g.Live && s.cache.lastSeen(id).Before(live) {
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
func (s *Server) holderView(ctx context.Context, l *egress.Lease, live []egress.Candidate) *edgeapi.Holder {
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

// fence answers 204 while the caller holds the lease at the epoch it
// names (and the peer it names is a live edge of its org), else 409 with
// the reason: a holder frozen past its lease never commits a send.
func (s *Server) fence(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	var req edgeapi.FenceRequest
	if err := decode(r, edgeapi.MaxElectBytes, &req); err != nil {
		return err
	}
	if _, err := egress.ParseClass(req.Class); err != nil {
		return errorf(http.StatusBadRequest, "class: %v", err)
	}
	if req.Epoch < 1 {
		return errorf(http.StatusBadRequest, "epoch %d: want the lease's epoch, 1 or more", req.Epoch)
	}
	reason, holder, err := s.Fence(r.Context(), st.ID, req)
	if err != nil {
		return err
	}
	if reason == "" {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	s.log.Warn("egress fence refused", zap.String("edge", st.ID), zap.String("class", req.Class), zap.Int64("epoch", req.Epoch),
		zap.String("peer", req.Peer), zap.String("reason", reason))
	writeJSON(w, http.StatusConflict, edgeapi.FenceRefusal{Reason: reason, Holder: holder})
	return nil
}

// Fence checks caller's lease: the refusal reason, empty when it holds.
func (s *Server) Fence(ctx context.Context, caller string, req edgeapi.FenceRequest) (string, *edgeapi.Holder, error) {
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
	if at := s.cache.lastSeen(p.ID); at.After(seen) {
		seen = at
	}
	if !p.Enrolled() {
		return egress.FencePeerNotEnrolled, h, nil
	}
	if seen.Before(now.Add(-s.o.EgressLease)) {
		return egress.FencePeerNotLive, h, nil
	}
	return "", nil, nil
}

// egressReport is the egress part of a status report as stored, checked:
// an intake URL that is not https is dropped, probes of unknown classes
// or with oversized destinations are dropped, and each probe's time is
// moved onto this clock (its age on the agent's clock, at the report's
// time, subtracted from now), so that an agent whose clock is off neither
// ages nor freshens its probes. A report without an egress part clears it.
func (s *Server) egressReport(id string, rep *edgeapi.EgressReport, at time.Time) (string, map[string]store.Reach) {
	if rep == nil {
		return "", nil
	}
	now := s.o.Now()
	intake := ""
	if rep.IntakeURL != "" {
		if u, err := url.Parse(rep.IntakeURL); err != nil || u.Scheme != "https" || u.Host == "" || len(rep.IntakeURL) > maxEgressURL {
			s.log.Warn("egress report: intake URL refused (want https://HOST:PORT/)", zap.String("edge", id), zap.String("intake_url", trunc(rep.IntakeURL)))
		} else {
			intake = rep.IntakeURL
		}
	}
	reach := map[string]store.Reach{}
	for class, rr := range rep.Reach {
		if !egress.Class(class).Valid() || len(rr.Destination) > maxEgressURL || rr.CheckedAt.IsZero() {
			continue
		}
		checked := rr.CheckedAt
		if !at.IsZero() {
			age := max(at.Sub(rr.CheckedAt), 0) // a probe "after" its report is as fresh as the report
			checked = now.Add(-age)
		}
		reach[class] = store.Reach{Destination: rr.Destination, Reachable: rr.Reachable, CheckedAt: checked}
	}
	return intake, reach
}

func trunc(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}
