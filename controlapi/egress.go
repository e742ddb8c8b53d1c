package controlapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
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
		// Unchanged status reports come every StatusInterval (plus the
		// agent's look at its status, and its probe's own interval) and
		// are written when the last write is StatusRewrite old (a probe's
		// outcome changing is a change): a live edge's stored probe is
		// never older than the interval and two minutes.
		o.EgressReachWindow = max(2*o.EgressLease, time.Minute, o.StatusRewrite+time.Minute, o.StatusInterval+2*time.Minute)
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
	resp, err := s.leases.Elect(r.Context(), st.ID, class, req.Reachable)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// Elect runs the election for caller and class: what PathEgressElect
// answers (exported for the benchmarks).
func (s *Server) Elect(ctx context.Context, caller string, class egress.Class, reachable bool) (edgeapi.ElectResponse, error) {
	return s.leases.Elect(ctx, caller, class, reachable)
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
	reason, holder, err := s.leases.Fence(r.Context(), st.ID, req)
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
