package controlapi_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/edgeapi"
	"cellvisor/egress"
)

const egressDest = "https://127.0.0.1:9/ingest/metering"

func newClock() *clock { return &clock{now: time.Now()} }

func egressOpts(c *clock) func(*controlapi.Options) {
	return func(o *controlapi.Options) { o.Now, o.Store.Now, o.EgressLease = c.Now, c.Now, 2*time.Second }
}

// egressEdge is an enrolled edge and its mutual-TLS client.
type egressEdge struct {
	id string
	hc *http.Client
	e  *env
}

func (e *env) egressEdge(t *testing.T, name, org, region string) egressEdge {
	t.Helper()
	zone := region + "-a"
	ce, err := e.admin.CreateEdge(ctx(t), adminapi.EdgeRequest{Name: name, Org: org, Country: "de", Continent: "eu",
		EdgeUpdateRequest: adminapi.EdgeUpdateRequest{Region: &region, Zone: &zone}})
	if err != nil {
		t.Fatal(err)
	}
	if ce.Edge.Region != region || ce.Edge.Priority != 100 || ce.Edge.Weight != 100 || ce.Edge.CostTier != 0 {
		t.Fatalf("created edge %+v: want region %s and the default ranking", ce.Edge, region)
	}
	key, csrPEM := keyCSR(t)
	code, er := e.rawEnroll(t, ce.Token, csrPEM)
	if code != http.StatusOK {
		t.Fatalf("enroll %s: %d", name, code)
	}
	return egressEdge{id: ce.Edge.ID, hc: e.mtls(t, er.Certificate, key), e: e}
}

func (x egressEdge) elect(t *testing.T, class egress.Class, reachable bool) edgeapi.ElectResponse {
	t.Helper()
	code, data, msg := post(t, x.hc, x.e.edgeURL+edgeapi.PathEgressElect, edgeapi.ElectRequest{Class: string(class), Reachable: reachable})
	if code != http.StatusOK {
		t.Fatalf("elect: %d %s", code, msg)
	}
	var r edgeapi.ElectResponse
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func (x egressEdge) fence(t *testing.T, req edgeapi.FenceRequest) (int, string) {
	t.Helper()
	code, data, _ := post(t, x.hc, x.e.edgeURL+edgeapi.PathEgressFence, req)
	var fr edgeapi.FenceRefusal
	if code == http.StatusConflict {
		if err := json.Unmarshal(data, &fr); err != nil {
			t.Fatal(err)
		}
	}
	return code, fr.Reason
}

// report posts a status report with an egress part, stamped at (the
// agent's clock).
func (x egressEdge) report(t *testing.T, at time.Time, rep edgeapi.EgressReport) {
	t.Helper()
	status, _ := json.Marshal(map[string]any{"version": "test", "egress": rep})
	code, _, msg := post(t, x.hc, x.e.edgeURL+edgeapi.PathStatus, edgeapi.StatusReport{At: at, Status: status})
	if code != http.StatusNoContent {
		t.Fatalf("status: %d %s", code, msg)
	}
}

func reaches(at time.Time, intake string, classes ...egress.Class) edgeapi.EgressReport {
	r := edgeapi.EgressReport{IntakeURL: intake, Reach: map[string]edgeapi.ReachReport{}}
	for _, c := range classes {
		r.Reach[string(c)] = edgeapi.ReachReport{Destination: egressDest, Reachable: true, CheckedAt: at.Add(-time.Second)}
	}
	return r
}

func want(t *testing.T, who string, r edgeapi.ElectResponse, outcome, stage, reason string) {
	t.Helper()
	if r.Outcome != outcome || r.Stage != stage || r.Reason != reason {
		t.Fatalf("%s: %s/%s/%s, want %s/%s/%s", who, r.Outcome, r.Stage, r.Reason, outcome, stage, reason)
	}
}

// TestElectionCascadeAndFailover runs the cascade through the edge API
// on a real store: single edge, ranking, fencing, failover in region
// first, then out of region, then back, with epochs that only grow.
func TestElectionCascadeAndFailover(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		clk := newClock()
		e = serveOn(t, e.dsn, e.sealKey, egressOpts(clk))
		eu1 := e.egressEdge(t, "eu-1", "acme", "eu")

		r := eu1.elect(t, egress.Metering, true)
		want(t, "no policy", r, edgeapi.OutcomeRefused, edgeapi.StageLiveResolve, egress.ReasonNoDestination)
		if _, err := e.admin.SetEgressPolicy(ctx(t), "acme", "metering", adminapi.EgressPolicyRequest{Destination: egressDest, Region: "eu"}); err != nil {
			t.Fatal(err)
		}
		r = eu1.elect(t, egress.Metering, false)
		want(t, "single, cannot reach", r, edgeapi.OutcomeRefused, edgeapi.StageNoBlackHole, egress.ReasonNoReachable)
		r = eu1.elect(t, egress.Metering, true)
		want(t, "single", r, edgeapi.OutcomeElected, edgeapi.StageSingle, egress.ReasonAlone)
		if !r.Alone || r.Holder == nil || r.Holder.EdgeID != eu1.id || r.Holder.Epoch != 1 || r.Renew != 2*time.Second/3 || r.Destination != egressDest {
			t.Fatalf("single: %+v holder %+v", r, r.Holder)
		}

		eu2 := e.egressEdge(t, "eu-2", "acme", "eu")
		us1 := e.egressEdge(t, "us-1", "acme", "us")
		other := e.egressEdge(t, "other-1", "globex", "eu")
		now := clk.Now()
		eu1.report(t, now, reaches(now, "https://127.0.0.1:7001/", egress.Metering))
		eu2.report(t, now, reaches(now, "https://127.0.0.1:7002/", egress.Metering))
		// us-1's clock is a minute ahead: its probe is still fresh.
		us1.report(t, now.Add(time.Minute), reaches(now.Add(time.Minute), "https://127.0.0.1:7003/", egress.Metering))

		r = eu1.elect(t, egress.Metering, true)
		want(t, "holder among peers", r, edgeapi.OutcomeElected, edgeapi.StageLeaseRace, egress.ReasonRenewedLease)
		if r.Alone || r.Holder.Epoch != 1 {
			t.Fatalf("renewal: %+v", r.Holder)
		}
		r = us1.elect(t, egress.Metering, true)
		want(t, "out of region", r, edgeapi.OutcomeDeferred, edgeapi.StageRanking, egress.ReasonOutranked)
		if r.Holder == nil || r.Holder.EdgeID != eu1.id || r.Holder.IntakeURL != "https://127.0.0.1:7001/" || r.Holder.Region != "eu" {
			t.Fatalf("holder as a peer sees it: %+v", r.Holder)
		}
		r = eu2.elect(t, egress.Metering, true)
		if r.Outcome != edgeapi.OutcomeDeferred || r.Holder.EdgeID != eu1.id {
			t.Fatalf("eu-2 beside the holder: %+v", r)
		}

		// Fencing.
		for _, c := range []struct {
			who  egressEdge
			req  edgeapi.FenceRequest
			code int
			why  string
		}{
			{eu1, edgeapi.FenceRequest{Class: "metering", Epoch: 1}, http.StatusNoContent, ""},
			{eu1, edgeapi.FenceRequest{Class: "metering", Epoch: 1, Peer: eu2.id}, http.StatusNoContent, ""},
			{eu1, edgeapi.FenceRequest{Class: "metering", Epoch: 1, Peer: other.id}, http.StatusConflict, egress.FencePeerNotInOrg},
			{eu1, edgeapi.FenceRequest{Class: "metering", Epoch: 1, Peer: "no-such-edge"}, http.StatusConflict, egress.FencePeerNotInOrg},
			{eu1, edgeapi.FenceRequest{Class: "metering", Epoch: 2}, http.StatusConflict, egress.FenceStaleEpoch},
			{eu2, edgeapi.FenceRequest{Class: "metering", Epoch: 1}, http.StatusConflict, egress.FenceNotHolder},
			{eu1, edgeapi.FenceRequest{Class: "license", Epoch: 1}, http.StatusConflict, egress.FenceNoLease},
			{other, edgeapi.FenceRequest{Class: "metering", Epoch: 1}, http.StatusConflict, egress.FenceNoLease},
		} {
			if code, why := c.who.fence(t, c.req); code != c.code || why != c.why {
				t.Fatalf("fence %+v: %d %q, want %d %q", c.req, code, why, c.code, c.why)
			}
		}

		// eu-1 dies (stops calling): after its lease, the in-region
		// survivor takes over, never the out-of-region one.
		clk.add(2100 * time.Millisecond)
		now = clk.Now()
		eu2.report(t, now, reaches(now, "https://127.0.0.1:7002/", egress.Metering))
		us1.report(t, now.Add(time.Minute), reaches(now.Add(time.Minute), "https://127.0.0.1:7003/", egress.Metering))
		want(t, "us-1 while eu-2 lives", us1.elect(t, egress.Metering, true), edgeapi.OutcomeDeferred, edgeapi.StageRanking, egress.ReasonOutranked)
		r = eu2.elect(t, egress.Metering, true)
		want(t, "in-region successor", r, edgeapi.OutcomeElected, edgeapi.StageLeaseRace, egress.ReasonWonLease)
		if r.Holder.EdgeID != eu2.id || r.Holder.Epoch != 2 {
			t.Fatalf("successor lease %+v", r.Holder)
		}
		// eu-1 resumes: its epoch is stale, it does not take back the lease.
		if code, why := eu1.fence(t, edgeapi.FenceRequest{Class: "metering", Epoch: 1}); code != http.StatusConflict || why != egress.FenceNotHolder {
			t.Fatalf("resumed holder's fence: %d %s", code, why)
		}
		// (lease_held_by_peer when it ranks above eu-2, else outranked: the
		// hash decides between equals.)
		if r = eu1.elect(t, egress.Metering, true); r.Outcome != edgeapi.OutcomeDeferred || r.Holder.EdgeID != eu2.id {
			t.Fatalf("resumed eu-1: %+v holder %+v, want deferred to eu-2", r, r.Holder)
		}

		// Both eu edges die: with no in-region survivor, us-1 takes over.
		clk.add(2100 * time.Millisecond)
		now = clk.Now()
		us1.report(t, now.Add(time.Minute), reaches(now.Add(time.Minute), "https://127.0.0.1:7003/", egress.Metering))
		r = us1.elect(t, egress.Metering, true)
		want(t, "out-of-region fallback", r, edgeapi.OutcomeElected, edgeapi.StageSingle, egress.ReasonAlone)
		if r.Holder.EdgeID != us1.id || r.Holder.Epoch != 3 {
			t.Fatalf("fallback lease %+v", r.Holder)
		}
		// An in-region edge returns: it takes over at once, fencing us-1 out.
		eu1.report(t, clk.Now(), reaches(clk.Now(), "https://127.0.0.1:7001/", egress.Metering))
		r = eu1.elect(t, egress.Metering, true)
		want(t, "in-region return", r, edgeapi.OutcomeElected, edgeapi.StageLeaseRace, egress.ReasonWonLease)
		if r.Holder.EdgeID != eu1.id || r.Holder.Epoch != 4 {
			t.Fatalf("takeover lease %+v", r.Holder)
		}
		if code, why := us1.fence(t, edgeapi.FenceRequest{Class: "metering", Epoch: 3}); code != http.StatusConflict || why != egress.FenceNotHolder {
			t.Fatalf("superseded holder's fence: %d %s", code, why)
		}
		want(t, "superseded us-1", us1.elect(t, egress.Metering, true), edgeapi.OutcomeDeferred, edgeapi.StageRanking, egress.ReasonOutranked)

		ls, err := e.admin.Leases(ctx(t), "acme")
		if err != nil || len(ls) != 1 || ls[0].Holder != eu1.id || ls[0].HolderName != "eu-1" || ls[0].Region != "eu" || ls[0].Epoch != 4 || ls[0].Expired {
			t.Fatalf("leases %+v, %v", ls, err)
		}
		// Nobody renews: the holder's own fence refuses past the lease.
		clk.add(2100 * time.Millisecond)
		if code, why := eu1.fence(t, edgeapi.FenceRequest{Class: "metering", Epoch: 4}); code != http.StatusConflict || why != egress.FenceLeaseExpired {
			t.Fatalf("fence past the lease: %d %s", code, why)
		}
		if ls, err = e.admin.Leases(ctx(t), "acme"); err != nil || len(ls) != 1 || !ls[0].Expired {
			t.Fatalf("leases past expiry %+v, %v", ls, err)
		}
		r = eu1.elect(t, egress.Metering, true)
		want(t, "alone again", r, edgeapi.OutcomeElected, edgeapi.StageSingle, egress.ReasonAlone)
		if r.Holder.Epoch != 5 {
			t.Fatalf("re-acquired at epoch %d, want 5", r.Holder.Epoch)
		}
		// The holder's own probe fails: refused, it gives the lease up at
		// once rather than leave it to expire.
		r = eu1.elect(t, egress.Metering, false)
		want(t, "holder that cannot reach", r, edgeapi.OutcomeRefused, edgeapi.StageNoBlackHole, egress.ReasonNoReachable)
		if r.Holder != nil {
			t.Fatalf("released lease still named: %+v", r.Holder)
		}
		if ls, err := e.admin.Leases(ctx(t), "acme"); err != nil || len(ls) != 0 {
			t.Fatalf("leases after release: %+v, %v", ls, err)
		}

		// Hard requirement no live edge meets; a destination nobody reaches.
		if _, err := e.admin.SetEgressPolicy(ctx(t), "acme", "license", adminapi.EgressPolicyRequest{Destination: egressDest,
			Require: edgeapi.Requirement{Region: "ap"}}); err != nil {
			t.Fatal(err)
		}
		want(t, "hard requirement", eu1.elect(t, egress.License, true), edgeapi.OutcomeRefused, edgeapi.StageLiveResolve, egress.ReasonHardRequirementUnmet)
		if _, err := e.admin.SetEgressPolicy(ctx(t), "acme", "siem_forwarding", adminapi.EgressPolicyRequest{Destination: "https://127.0.0.1:9/siem"}); err != nil {
			t.Fatal(err)
		}
		// eu-1 and us-1 reported reaching the metering destination, not this one.
		want(t, "no reachable", eu1.elect(t, egress.SIEMForwarding, false), edgeapi.OutcomeRefused, edgeapi.StageNoBlackHole, egress.ReasonNoReachable)
		want(t, "another org without a policy", other.elect(t, egress.Metering, true), edgeapi.OutcomeRefused, edgeapi.StageLiveResolve, egress.ReasonNoDestination)
	})
}

// TestElectRace: edges that each see themselves as the top candidate
// (their peers' reach unknown, so deny-closed) race for the lease at once
// through the API: exactly one is elected, the rest lose the race or find
// the lease held, and every holder named is the winner.
func TestElectRace(t *testing.T) {
	clk := newClock()
	e := serveOn(t, t.TempDir()+"/control.db", make([]byte, 32), egressOpts(clk))
	if _, err := e.admin.SetEgressPolicy(ctx(t), "acme", "metering", adminapi.EgressPolicyRequest{Destination: egressDest}); err != nil {
		t.Fatal(err)
	}
	var edges []egressEdge
	for i := range 12 {
		edges = append(edges, e.egressEdge(t, "edge-"+string(rune('a'+i)), "acme", "eu"))
	}
	var wg sync.WaitGroup
	rs := make([]edgeapi.ElectResponse, len(edges))
	for i, x := range edges {
		wg.Add(1)
		go func() { defer wg.Done(); rs[i] = x.elect(t, egress.Metering, true) }()
	}
	wg.Wait()
	var winner string
	for i, r := range rs {
		if r.Outcome == edgeapi.OutcomeElected {
			if winner != "" {
				t.Fatalf("two elected: %s and %s", winner, edges[i].id)
			}
			winner = edges[i].id
		}
	}
	if winner == "" {
		t.Fatalf("none elected: %+v", rs)
	}
	for i, r := range rs {
		if edges[i].id == winner {
			continue
		}
		if r.Outcome != edgeapi.OutcomeDeferred || r.Stage != edgeapi.StageLeaseRace ||
			(r.Reason != egress.ReasonLostRace && r.Reason != egress.ReasonLeaseHeldByPeer) {
			t.Fatalf("loser %d: %s/%s/%s", i, r.Outcome, r.Stage, r.Reason)
		}
		if r.Holder == nil || r.Holder.EdgeID != winner || r.Holder.Epoch != 1 {
			t.Fatalf("loser %d names holder %+v, want %s at epoch 1", i, r.Holder, winner)
		}
	}
}

func TestEgressRequestsAreStrict(t *testing.T) {
	e := start(t, t.TempDir()+"/control.db")
	x := e.egressEdge(t, "eu-1", "acme", "eu")
	for _, c := range []struct {
		path string
		body any
		code int
	}{
		{edgeapi.PathEgressElect, map[string]any{"class": "metering", "reachable": true, "extra": 1}, http.StatusBadRequest},
		{edgeapi.PathEgressElect, map[string]any{"class": "telemetry"}, http.StatusBadRequest},
		{edgeapi.PathEgressElect, map[string]any{"class": strings.Repeat("x", edgeapi.MaxElectBytes)}, http.StatusRequestEntityTooLarge},
		{edgeapi.PathEgressFence, map[string]any{"class": "metering", "epoch": 0}, http.StatusBadRequest},
		{edgeapi.PathEgressFence, map[string]any{"class": "metering", "epoch": 1, "holder": "me"}, http.StatusBadRequest},
	} {
		if code, _, msg := post(t, x.hc, e.edgeURL+c.path, c.body); code != c.code {
			t.Fatalf("%s %v: %d %s, want %d", c.path, c.body, code, msg, c.code)
		}
	}
}

func TestEgressAdmin(t *testing.T) {
	e := start(t, t.TempDir()+"/control.db")
	c := ctx(t)
	for _, bad := range []adminapi.EgressPolicyRequest{
		{Destination: "ftp://x/"}, {Destination: "https://user:pw@x/"}, {Destination: "https://x/", Region: "EU WEST"},
		{Destination: "https://x/", Require: edgeapi.Requirement{Zone: "-a"}},
	} {
		var ae *adminapi.Error
		if _, err := e.admin.SetEgressPolicy(c, "acme", "metering", bad); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
			t.Fatalf("policy %+v: %v, want 400", bad, err)
		}
	}
	var ae *adminapi.Error
	if _, err := e.admin.SetEgressPolicy(c, "acme", "telemetry", adminapi.EgressPolicyRequest{Destination: "https://x/"}); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Fatalf("unknown class: %v", err)
	}
	p, err := e.admin.SetEgressPolicy(c, "acme", "metering", adminapi.EgressPolicyRequest{Destination: "https://x/m", Region: "eu",
		Require: edgeapi.Requirement{Zone: "eu-a"}})
	if err != nil || p.Destination != "https://x/m" || p.Require.Zone != "eu-a" {
		t.Fatalf("set: %+v, %v", p, err)
	}
	if got, err := e.admin.EgressPolicy(c, "acme", "metering"); err != nil || got != p {
		t.Fatalf("show: %+v, %v; want %+v", got, err, p)
	}
	if ps, err := e.admin.EgressPolicies(c, "acme"); err != nil || len(ps) != 1 {
		t.Fatalf("list: %+v, %v", ps, err)
	}
	if _, err := e.admin.ClearEgressPolicy(c, "acme", "metering"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.EgressPolicy(c, "acme", "metering"); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Fatalf("show after clear: %v, want 404", err)
	}

	ce := e.createEdge(t, "fra-1")
	region, prio, weight := "eu-central", 10, 7
	v, err := e.admin.UpdateEdge(c, ce.Edge.ID, adminapi.EdgeUpdateRequest{Region: &region, Priority: &prio, Weight: &weight})
	if err != nil || v.Region != region || v.Priority != 10 || v.Weight != 7 || v.CostTier != 0 || v.Zone != "" {
		t.Fatalf("update: %+v, %v", v, err)
	}
	if v, err = e.admin.Edge(c, ce.Edge.ID); err != nil || v.Region != region || v.Priority != 10 {
		t.Fatalf("show after update: %+v, %v", v, err)
	}
	neg := -1
	if _, err := e.admin.UpdateEdge(c, ce.Edge.ID, adminapi.EdgeUpdateRequest{CostTier: &neg}); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Fatalf("negative cost tier: %v", err)
	}
	bad := "Not A Region"
	if _, err := e.admin.CreateEdge(c, adminapi.EdgeRequest{Name: "x-1", Org: "acme", Country: "de", Continent: "eu",
		EdgeUpdateRequest: adminapi.EdgeUpdateRequest{Region: &bad}}); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Fatalf("bad region at creation: %v", err)
	}
}

// Deleting or rotating the holder's edge ends its leases at once: the
// lease list no longer shows it, its successor acquires at its next call
// (not after the expiry), and the removed identity is refused (401).
func TestRemovedHolderLosesItsLeaseAtOnce(t *testing.T) {
	for _, how := range []string{"delete", "rotate"} {
		t.Run(how, func(t *testing.T) {
			eachStore(t, func(t *testing.T, e *env) {
				clk := newClock()
				e = serveOn(t, e.dsn, e.sealKey, egressOpts(clk))
				if _, err := e.admin.SetEgressPolicy(ctx(t), "acme", "metering", adminapi.EgressPolicyRequest{Destination: egressDest, Region: "eu"}); err != nil {
					t.Fatal(err)
				}
				if _, err := e.admin.SetEgressPolicy(ctx(t), "acme", "siem_forwarding", adminapi.EgressPolicyRequest{Destination: egressDest, Region: "eu"}); err != nil {
					t.Fatal(err)
				}
				a := e.egressEdge(t, "eu-1", "acme", "eu")
				b := e.egressEdge(t, "eu-2", "acme", "eu")
				low := 200 // b ranks below a: a holds both classes
				if _, err := e.admin.UpdateEdge(ctx(t), b.id, adminapi.EdgeUpdateRequest{Priority: &low}); err != nil {
					t.Fatal(err)
				}
				now := clk.Now()
				a.report(t, now, reaches(now, "https://127.0.0.1:7001/", egress.Metering, egress.SIEMForwarding))
				b.report(t, now, reaches(now, "https://127.0.0.1:7002/", egress.Metering, egress.SIEMForwarding))
				for _, c := range []egress.Class{egress.Metering, egress.SIEMForwarding} {
					if r := a.elect(t, c, true); r.Outcome != edgeapi.OutcomeElected || r.Holder.EdgeID != a.id {
						t.Fatalf("%s: %+v", c, r)
					}
					if r := b.elect(t, c, true); r.Outcome != edgeapi.OutcomeDeferred || r.Holder == nil || r.Holder.EdgeID != a.id {
						t.Fatalf("%s, the holder's peer: %+v", c, r)
					}
				}
				switch how {
				case "delete":
					if _, err := e.admin.DeleteEdge(ctx(t), a.id); err != nil {
						t.Fatal(err)
					}
				case "rotate":
					if _, err := e.admin.Rotate(ctx(t), a.id); err != nil {
						t.Fatal(err)
					}
				}
				// No time passes: the lease would still run for 2 s.
				leases, err := e.admin.Leases(ctx(t), "acme")
				if err != nil || len(leases) != 0 {
					t.Fatalf("leases after the %s: %+v, %v; want none", how, leases, err)
				}
				for _, c := range []egress.Class{egress.Metering, egress.SIEMForwarding} {
					r := b.elect(t, c, true)
					want(t, "successor", r, edgeapi.OutcomeElected, edgeapi.StageSingle, egress.ReasonAlone)
					if r.Holder == nil || r.Holder.EdgeID != b.id || r.Holder.Epoch != 2 {
						t.Fatalf("%s successor: %+v", c, r.Holder)
					}
				}
				code, _, _ := post(t, a.hc, e.edgeURL+edgeapi.PathEgressElect, edgeapi.ElectRequest{Class: "metering", Reachable: true})
				if code != http.StatusUnauthorized {
					t.Fatalf("the removed edge's election: HTTP %d, want 401", code)
				}
				// As a peer forwarding to the new holder's intake, the
				// removed edge is refused by the fence's peer check.
				why := map[string]string{"delete": egress.FencePeerNotInOrg, "rotate": egress.FencePeerNotEnrolled}[how]
				if code, reason := b.fence(t, edgeapi.FenceRequest{Class: "metering", Epoch: 2, Peer: a.id}); code != http.StatusConflict || reason != why {
					t.Fatalf("fence naming the removed edge as peer: %d %q, want 409 %q", code, reason, why)
				}
			})
		})
	}
}
