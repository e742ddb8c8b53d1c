package outbound

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
)

// fakeControl speaks the egress part of the edge-control API (elect,
// fence) over mutual TLS, with a simple cascade: the live, reachable edges
// of the caller's org ranked by their order of registration; the top one
// acquires or renews the (org, class) lease, the others defer.
type fakeControl struct {
	srv   *httptest.Server
	lease time.Duration
	dest  string

	mu     sync.Mutex // guards the following fields
	edges  []*fakeEdge
	leases map[[2]string]*edgeapi.Holder
	epoch  int64
	refuse string // when set, every election is refused with it
	fences int
}

type fakeEdge struct {
	id, org, intake string
	live, reachable bool
}

func newFakeControl(t *testing.T, ca *testCA, dest string, lease time.Duration) *fakeControl {
	f := &fakeControl{lease: lease, dest: dest, leases: map[[2]string]*edgeapi.Holder{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+edgeapi.PathEgressElect, f.elect)
	mux.HandleFunc("POST "+edgeapi.PathEgressFence, f.fence)
	f.srv = httptest.NewUnstartedServer(mux)
	f.srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.serverCert(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool()}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeControl) add(id, org, intake string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.edges = append(f.edges, &fakeEdge{id: id, org: org, intake: intake, live: true})
}

func (f *fakeControl) edge(id string) *fakeEdge {
	for _, e := range f.edges {
		if e.id == id {
			return e
		}
	}
	return nil
}

// setHolder gives the lease to id at a new epoch (what an expiry and a
// successor's acquisition do).
func (f *fakeControl) setHolder(org, class, id string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.epoch++
	e := f.edge(id)
	f.leases[[2]string{org, class}] = &edgeapi.Holder{EdgeID: id, IntakeURL: e.intake, Epoch: f.epoch, ExpiresAt: time.Now().Add(f.lease)}
	return f.epoch
}

func caller(r *http.Request) string { return r.TLS.VerifiedChains[0][0].Subject.CommonName }

func (f *fakeControl) elect(w http.ResponseWriter, r *http.Request) {
	var req edgeapi.ElectRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, edgeapi.MaxElectBytes)).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	me := f.edge(caller(r))
	me.reachable = req.Reachable
	resp := edgeapi.ElectResponse{Class: req.Class, Destination: f.dest, Renew: f.lease / 3}
	key := [2]string{me.org, req.Class}
	var cands []*fakeEdge
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

func (f *fakeControl) fence(w http.ResponseWriter, r *http.Request) {
	var req edgeapi.FenceRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, edgeapi.MaxElectBytes)).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fences++
	me := f.edge(caller(r))
	h := f.leases[[2]string{me.org, req.Class}]
	reason := ""
	switch {
	case h == nil || !time.Now().Before(h.ExpiresAt):
		reason = "no current lease"
	case h.EdgeID != me.id || h.Epoch != req.Epoch:
		reason = "stale epoch"
	case req.Peer != "" && !slices.ContainsFunc(f.edges, func(e *fakeEdge) bool { return e.id == req.Peer && e.org == me.org && e.live }):
		reason = "peer is not a live edge of the org"
	}
	if reason != "" {
		w.WriteHeader(http.StatusConflict)
		json.NewEncoder(w).Encode(edgeapi.FenceRefusal{Reason: reason, Holder: h})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
