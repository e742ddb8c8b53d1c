package outboundtest

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/egress"
)

// Control speaks the egress part of the edge-control API (elect,
// fence) over mutual TLS, with a simple cascade: the live, reachable edges
// of the caller's org ranked by their order of registration; the top one
// acquires or renews the (org, class) lease, the others defer.
type Control struct {
	// URL is where it serves (mutual TLS), once Serve ran.
	URL   string
	lease time.Duration
	dest  string

	mu     sync.Mutex // guards the following fields
	edges  []*Edge
	leases map[[2]string]*edgeapi.Holder
	epoch  int64
	refuse string // when set, every election is refused with it
	delay  time.Duration
	fenceD time.Duration
}

// Edge is an edge the fake knows.
type Edge struct {
	id, org, intake string
	live, reachable bool
}

// NewControl is a fake control API whose classes all go to dest, with
// leases of lease.
func NewControl(dest string, lease time.Duration) *Control {
	return &Control{lease: lease, dest: dest, leases: map[[2]string]*edgeapi.Holder{}}
}

// Handler serves elect and fence; the caller is its verified client
// certificate's CN.
func (f *Control) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+edgeapi.PathEgressElect, f.late(f.decide, &f.delay))
	mux.HandleFunc("POST "+edgeapi.PathEgressFence, f.late(f.decideFence, &f.fenceD))
	return mux
}

// Serve serves Handler over mutual TLS with a server certificate of ca,
// requiring client certificates of ca, until the test ends.
func (f *Control) Serve(t testing.TB, ca *CA) {
	srv := httptest.NewUnstartedServer(f.Handler())
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.ServerCert(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	f.URL = srv.URL
}

// Add registers a live edge of org with its intake URL.
func (f *Control) Add(id, org, intake string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.edges = append(f.edges, &Edge{id: id, org: org, intake: intake, live: true})
}

func (f *Control) edge(id string) *Edge {
	for _, e := range f.edges {
		if e.id == id {
			return e
		}
	}
	return nil
}

// SetHolder gives the lease to id at a new epoch (what an expiry and a
// successor's acquisition do).
func (f *Control) SetHolder(org, class, id string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.epoch++
	e := f.edge(id)
	f.leases[[2]string{org, class}] = &edgeapi.Holder{EdgeID: id, IntakeURL: e.intake, Epoch: f.epoch, ExpiresAt: time.Now().Add(f.lease)}
	return f.epoch
}

func caller(r *http.Request) string { return r.TLS.VerifiedChains[0][0].Subject.CommonName }

// SetElectDelay makes every election answer d late (a loaded control
// API): the lease runs from when the election is decided, before the
// delay, as on the real control API (its clock is read first).
func (f *Control) SetElectDelay(d time.Duration) {
	f.mu.Lock()
	f.delay = d
	f.mu.Unlock()
}

// late answers what decide wrote, *d after it decided (d read under f.mu).
func (f *Control) late(decide http.HandlerFunc, d *time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		decide(rec, r)
		f.mu.Lock()
		delay := *d
		f.mu.Unlock()
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}
}

func (f *Control) decide(w http.ResponseWriter, r *http.Request) {
	var req edgeapi.ElectRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, edgeapi.MaxElectBytes)).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	me := f.edge(caller(r))
	if me == nil {
		http.Error(w, "client certificate is not a current edge identity", http.StatusUnauthorized)
		return
	}
	me.reachable = req.Reachable
	resp := edgeapi.ElectResponse{Class: req.Class, Destination: f.dest, Renew: f.lease / 3}
	key := [2]string{me.org, req.Class}
	var cands []*Edge
	live := 0
	for _, e := range f.edges {
		if e.org == me.org && e.live {
			live++
			if e.reachable {
				cands = append(cands, e)
			}
		}
	}
	h := f.leases[key]
	if h != nil && !time.Now().Before(h.ExpiresAt) {
		h = nil
	}
	switch {
	case f.refuse != "":
		resp.Outcome, resp.Stage, resp.Reason = edgeapi.OutcomeRefused, edgeapi.StageLiveResolve, f.refuse
	case len(cands) == 0:
		resp.Outcome, resp.Stage, resp.Reason = edgeapi.OutcomeRefused, edgeapi.StageNoBlackHole, "no candidate can reach the destination"
	case h != nil && h.EdgeID == me.id:
		h.ExpiresAt = time.Now().Add(f.lease)
		resp.Outcome, resp.Stage = edgeapi.OutcomeElected, edgeapi.StageLeaseRace
	case h != nil:
		resp.Outcome, resp.Stage, resp.Reason = edgeapi.OutcomeDeferred, edgeapi.StageLeaseRace, "a peer holds the lease"
	case cands[0] != me:
		resp.Outcome, resp.Stage, resp.Reason = edgeapi.OutcomeDeferred, edgeapi.StageRanking, "outranked"
	default:
		f.epoch++
		h = &edgeapi.Holder{EdgeID: me.id, IntakeURL: me.intake, Epoch: f.epoch, ExpiresAt: time.Now().Add(f.lease)}
		f.leases[key] = h
		resp.Outcome, resp.Stage = edgeapi.OutcomeElected, edgeapi.StageLeaseRace
	}
	if live == 1 && resp.Outcome != edgeapi.OutcomeRefused {
		resp.Alone, resp.Stage = true, edgeapi.StageSingle
	}
	if h != nil && resp.Outcome != edgeapi.OutcomeRefused {
		c := *h
		resp.Holder = &c
	}
	json.NewEncoder(w).Encode(resp)
}

// SetFenceDelay makes every fence answer d after it is decided: a holder
// that stalls between its fence and its send.
func (f *Control) SetFenceDelay(d time.Duration) {
	f.mu.Lock()
	f.fenceD = d
	f.mu.Unlock()
}

func (f *Control) decideFence(w http.ResponseWriter, r *http.Request) {
	var req edgeapi.FenceRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, edgeapi.MaxElectBytes)).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	me := f.edge(caller(r))
	if me == nil {
		http.Error(w, "client certificate is not a current edge identity", http.StatusUnauthorized)
		return
	}
	h := f.leases[[2]string{me.org, req.Class}]
	reason := ""
	switch {
	case h == nil || !time.Now().Before(h.ExpiresAt):
		reason = egress.FenceNoLease
	case h.EdgeID != me.id:
		reason = egress.FenceNotHolder
	case h.Epoch != req.Epoch:
		reason = egress.FenceStaleEpoch
	case req.Peer != "" && !slices.ContainsFunc(f.edges, func(e *Edge) bool { return e.id == req.Peer && e.org == me.org }):
		reason = egress.FencePeerNotInOrg
	case req.Peer != "" && !slices.ContainsFunc(f.edges, func(e *Edge) bool { return e.id == req.Peer && e.live }):
		reason = egress.FencePeerNotLive
	}
	if reason != "" {
		w.WriteHeader(http.StatusConflict)
		json.NewEncoder(w).Encode(edgeapi.FenceRefusal{Reason: reason, Holder: h})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Remove forgets edge id, as deleting it does on the control API: its
// leases end, its calls are answered 401, and a fence naming it as a peer
// is refused (peer_not_in_org).
func (f *Control) Remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.edges = slices.DeleteFunc(f.edges, func(e *Edge) bool { return e.id == id })
	for k, h := range f.leases {
		if h.EdgeID == id {
			delete(f.leases, k)
		}
	}
}

// Known reports whether id is registered.
func (f *Control) Known(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.edge(id) != nil
}

// Refuse makes every election refused at the live-resolve stage with
// reason; "" ends it.
func (f *Control) Refuse(reason string) {
	f.mu.Lock()
	f.refuse = reason
	f.mu.Unlock()
}
