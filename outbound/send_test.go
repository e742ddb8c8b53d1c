package outbound

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/outbound/outboundtest"
	"cellvisor/testkit/corpingest"
	"cellvisor/testkit/testutil"
)

const org = "acme"

// ingested waits until the destination ingested id, and returns who sent it.
func (e *env) ingested(t *testing.T, id string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		if _, ok := e.ingest.Bundle(id); !ok {
			return fmt.Errorf("bundle %s not ingested; counts %+v", id, e.ingest.ByKey())
		}
		return nil
	})
}

func (ed *edge) route(class string) edgeapi.RouteStatus {
	for _, r := range ed.sender.Status().Routes {
		if r.Class == class {
			return r
		}
	}
	return edgeapi.RouteStatus{}
}

func (ed *edge) awaitRoute(t testing.TB, class, mode string) edgeapi.RouteStatus {
	t.Helper()
	var r edgeapi.RouteStatus
	testutil.Eventually(t, 10*time.Second, func() error {
		if r = ed.route(class); r.Route != mode {
			return fmt.Errorf("%s route of %s is %+v, want %s", ed.id, class, r, mode)
		}
		return nil
	})
	return r
}

func (ed *edge) awaitEmpty(t *testing.T) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		if n := ed.journal.Status().Bundles; n != 0 {
			return fmt.Errorf("%s journal holds %d bundles", ed.id, n)
		}
		return nil
	})
}

func TestDirectWhenElected(t *testing.T) {
	e := newEnv(t, time.Minute)
	a := e.startEdge("edge-a", org, edgeOpts{})
	r := a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	if !r.Alone || r.Holder != "edge-a" || r.Epoch < 1 || r.Expires == nil {
		t.Fatalf("route %+v: want alone, held by edge-a with an epoch and an expiry", r)
	}
	id := a.submit(t, "metering")
	e.ingested(t, id)
	a.awaitEmpty(t)
	want := map[corpingest.Key]corpingest.Counts{{Class: "metering", Sender: "edge-a", Epoch: r.Epoch}: {Received: 1, Unique: 1}}
	if got := e.ingest.ByKey(); !maps.Equal(got, want) {
		t.Fatalf("ingest counts %+v, want %+v", got, want)
	}
	st := a.sender.Status()
	if rep := st.Reach["metering"]; !rep.Reachable || rep.Destination != e.dest.URL+"/ingest" {
		t.Fatalf("reach %+v: want the destination reachable", rep)
	}
	if r := a.route("metering"); r.Direct != 1 || r.Pending != 0 {
		t.Fatalf("route after delivery %+v: want 1 delivered direct, 0 pending", r)
	}
}

// twoEdges starts a holder (a, registered first: top-ranked) and a peer.
func twoEdges(t *testing.T) (*env, *edge, *edge) {
	e := newEnv(t, time.Minute)
	a := e.startEdge("edge-a", org, edgeOpts{})
	a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	b := e.startEdge("edge-b", org, edgeOpts{})
	b.awaitRoute(t, "metering", edgeapi.RouteProxy)
	return e, a, b
}

func TestProxyToHolderIntake(t *testing.T) {
	e, a, b := twoEdges(t)
	ra := a.route("metering")
	id := b.submit(t, "metering")
	e.ingested(t, id)
	b.awaitEmpty(t)
	a.awaitEmpty(t)
	got, _ := e.ingest.Bundle(id)
	if got.Origin != "edge-b" {
		t.Fatalf("ingested bundle origin %q, want edge-b", got.Origin)
	}
	want := map[corpingest.Key]corpingest.Counts{{Class: "metering", Sender: "edge-a", Epoch: ra.Epoch}: {Received: 1, Unique: 1}}
	if got := e.ingest.ByKey(); !maps.Equal(got, want) {
		t.Fatalf("ingest counts %+v, want %+v (the holder sends, under its epoch)", got, want)
	}
	if r := b.route("metering"); r.Forwarded != 1 || r.Fallback != 0 || r.Holder != "edge-a" {
		t.Fatalf("peer route %+v: want 1 forwarded to edge-a, no fallback", r)
	}
}

// postIntake forwards a bundle to ed's intake as the holder of cert dir
// would, with its own TLS client (verifying ed's certificate).
func postIntake(t *testing.T, to *edge, from string, b edgeapi.Bundle, ptls *PeerTLS) (int, string, error) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: ptls.ClientConfig(to.id)}}
	defer hc.CloseIdleConnections()
	data, _ := json.Marshal(b)
	resp, err := hc.Post(to.intake+edgeapi.PathIntake+b.Class, "application/json", bytes.NewReader(data))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var fr edgeapi.FenceRefusal
	json.NewDecoder(resp.Body).Decode(&fr)
	return resp.StatusCode, fr.Reason, nil
}

func peerTLS(t *testing.T, dir string) *PeerTLS {
	p, err := NewPeerTLS(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestIntakeRefuses(t *testing.T) {
	e, a, b := twoEdges(t)
	// Another org's edge, enrolled with the same control plane's CA.
	other := e.startEdge("edge-x", "globex", edgeOpts{noIntake: true})
	other.awaitRoute(t, "metering", edgeapi.RouteDirect)
	bundle := func(from *edge, borg string) edgeapi.Bundle {
		bd, err := NewBundle(borg, from.id, "metering", time.Now(), []Metering{{Cell: "cell-01", Requests: 2}})
		if err != nil {
			t.Fatal(err)
		}
		return bd
	}
	cases := []struct {
		name   string
		to     *edge
		from   *edge
		borg   string
		status int
	}{
		{"holder accepts its org's peer", a, b, org, http.StatusAccepted},
		{"non-holder refuses", b, a, org, http.StatusConflict},
		{"another org's edge is refused", a, other, "globex", http.StatusForbidden},
		// Its bundle passes the intake's own checks; the control API's fence
		// refuses the peer: 403, which its sender never answers by a direct send.
		{"another org's edge naming this org is refused", a, other, org, http.StatusForbidden},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bd := bundle(tc.from, tc.borg)
			code, reason, err := postIntake(t, tc.to, tc.from.id, bd, peerTLS(t, tc.from.identity))
			if err != nil {
				t.Fatal(err)
			}
			if code != tc.status {
				t.Fatalf("HTTP %d (%s), want %d", code, reason, tc.status)
			}
			if code != http.StatusAccepted && reason == "" {
				t.Fatal("a refusal without a reason")
			}
		})
	}
	t.Run("a certificate of another CA is refused in the handshake", func(t *testing.T) {
		rogue := outboundtest.NewCA(t, "rogue CA")
		dir := rogue.EdgeIdentity(t, "edge-b", rogue.PEM)
		// The rogue trusts the real CA for the server, so that only the
		// intake's check of the client certificate is at stake.
		p := peerTLS(t, dir)
		p.roots = e.ca.Pool()
		_, _, err := postIntake(t, a, "edge-b", bundle(b, org), p)
		if err == nil {
			t.Fatal("a forward with a certificate of another CA was answered")
		}
	})
	t.Run("a forwarder refuses an intake that is not the holder's", func(t *testing.T) {
		// b's certificate is valid, but b is not the holder a forwarder asked for.
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: peerTLS(t, a.identity).ClientConfig("edge-a")}}
		defer hc.CloseIdleConnections()
		_, err := hc.Post(b.intake+edgeapi.PathIntake+"metering", "application/json", bytes.NewReader([]byte("{}")))
		if err == nil {
			t.Fatal("a forwarder talked to an intake whose certificate names another edge")
		}
	})
	t.Run("plain TLS without a client certificate is refused", func(t *testing.T) {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		defer hc.CloseIdleConnections()
		if _, err := hc.Post(a.intake+edgeapi.PathIntake+"metering", "application/json", bytes.NewReader([]byte("{}"))); err == nil {
			t.Fatal("a forward without a client certificate was answered")
		}
	})
}

func TestForwardToDeadHolderFallsBackDirect(t *testing.T) {
	e, a, b := twoEdges(t)
	a.stop() // the holder dies; its lease has not expired yet
	id := b.submit(t, "metering")
	e.ingested(t, id)
	b.awaitEmpty(t)
	want := map[corpingest.Key]corpingest.Counts{{Class: "metering", Sender: "edge-b", Epoch: 0}: {Received: 1, Unique: 1}}
	if got := e.ingest.ByKey(); !maps.Equal(got, want) {
		t.Fatalf("ingest counts %+v, want %+v (a fallback send, epoch 0)", got, want)
	}
	if r := b.route("metering"); r.Fallback != 1 || r.LastError == "" {
		t.Fatalf("route %+v: want 1 fallback delivery and the forward's error", r)
	}
}

func TestStaleFenceIsNeverCommitted(t *testing.T) {
	e, a, b := twoEdges(t)
	old := a.route("metering").Epoch
	// a is frozen past its lease: b takes over at a new epoch, and a's
	// route table still says direct at the old one.
	next := e.control.SetHolder(org, "metering", "edge-b")
	b.sender.Reelect("metering")
	b.awaitRoute(t, "metering", edgeapi.RouteDirect)
	if r := a.route("metering"); r.Route != edgeapi.RouteDirect || r.Epoch != old {
		t.Fatalf("a's route %+v: want still direct at epoch %d", r, old)
	}
	id := a.submit(t, "metering")
	e.ingested(t, id)
	a.awaitEmpty(t)
	b.awaitEmpty(t)
	for k := range e.ingest.ByKey() {
		if k.Sender == "edge-a" && k.Epoch == old {
			t.Fatalf("a delivered under its stale epoch %d: %+v", old, e.ingest.ByKey())
		}
	}
	want := map[corpingest.Key]corpingest.Counts{{Class: "metering", Sender: "edge-b", Epoch: next}: {Received: 1, Unique: 1}}
	if got := e.ingest.ByKey(); !maps.Equal(got, want) {
		t.Fatalf("ingest counts %+v, want %+v (forwarded to the new holder)", got, want)
	}
	if r := a.route("metering"); r.Route != edgeapi.RouteProxy || r.Holder != "edge-b" {
		t.Fatalf("a's route after the refused fence %+v: want proxy to edge-b", r)
	}
}

func TestJournalSurvivesRestart(t *testing.T) {
	e := newEnv(t, time.Minute)
	refusal := "hard requirement region=mars matches no live edge"
	e.control.Refuse(refusal)
	a := e.startEdge("edge-a", org, edgeOpts{})
	r := a.awaitRoute(t, "metering", edgeapi.RouteRefused)
	if r.Reason != refusal || r.Stage != edgeapi.StageLiveResolve {
		t.Fatalf("refused route %+v: want the stage and reason", r)
	}
	ids := []string{a.submit(t, "metering"), a.submit(t, "siem_forwarding"), a.submit(t, "metering")}
	if n := a.journal.Status().Bundles; n != 3 {
		t.Fatalf("journal holds %d bundles, want 3", n)
	}
	a.stop() // the process state is gone; the state directory stays
	e.control.Refuse("")
	a2 := e.startEdge("edge-a", org, edgeOpts{state: a.state})
	if n := a2.journal.Status().Bundles; n != 3 {
		t.Fatalf("restarted journal holds %d bundles, want 3", n)
	}
	for _, id := range ids {
		e.ingested(t, id)
	}
	a2.awaitEmpty(t)
	if tot := e.ingest.Total(); tot.Unique != 3 {
		t.Fatalf("ingest %+v: want the 3 bundles", tot)
	}
}

func TestSendFailureKeepsTheBundle(t *testing.T) {
	e := newEnv(t, time.Minute)
	e.ingest.Fail(2)
	a := e.startEdge("edge-a", org, edgeOpts{})
	a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	id := a.submit(t, "metering")
	e.ingested(t, id)
	a.awaitEmpty(t)
	if c := e.ingest.Class("metering"); c.Unique != 1 {
		t.Fatalf("ingest %+v: want the bundle once, after 2 failures", c)
	}
}

// A holder with a backlog to deliver (its peers' forwards keep coming)
// still renews its lease at the cadence: it stops between bundles when an
// election is due. Delivering 30 bundles to a slow destination takes over
// twice the lease; every one goes out under the first epoch, none is
// fenced out by a lease that ran out under its holder.
func TestHolderRenewsWhileDelivering(t *testing.T) {
	const lease = 600 * time.Millisecond
	e := &env{t: t, ca: outboundtest.NewCA(t, "edges CA"), ingest: corpingest.New()}
	// The destination takes 50ms a bundle (a slow corp ingest), so that
	// the backlog outlasts the lease.
	e.dest = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(50 * time.Millisecond):
		case <-r.Context().Done():
		}
		e.ingest.ServeHTTP(w, r)
	}))
	t.Cleanup(e.dest.Close)
	e.control = outboundtest.NewControl(e.dest.URL+"/ingest", lease)
	e.control.Serve(t, e.ca)
	a := e.startEdge("edge-a", org, edgeOpts{})
	r := a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	var ids []string
	for range 30 {
		ids = append(ids, a.submit(t, "metering"))
	}
	for _, id := range ids {
		e.ingested(t, id)
	}
	for k, c := range e.ingest.ByKey() {
		if k.Epoch != r.Epoch {
			t.Fatalf("%d deliveries under epoch %d (%+v), want all under the first, %d: the lease ran out while delivering", c.Received, k.Epoch, k, r.Epoch)
		}
	}
	if got := a.route("metering"); got.Epoch != r.Epoch || got.Direct != 30 {
		t.Fatalf("route %+v: want 30 delivered direct under epoch %d", got, r.Epoch)
	}
}

// A slow control API (each answer 1.2s late, the lease 1.5s from the
// answer, renewed every 500ms) does not make a holder lose its lease: the
// next election is due a third of the lease after the last one started,
// not after it answered (1.2s + 500ms would outlast the lease).
func TestHolderRenewsThroughSlowElections(t *testing.T) {
	e := newEnv(t, 1500*time.Millisecond)
	a := e.startEdge("edge-a", org, edgeOpts{})
	r := a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	e.control.SetElectDelay(1200 * time.Millisecond)
	// Bundles over several leases: each is fenced at the epoch first.
	deadline := time.Now().Add(4 * time.Second)
	n := 0
	for ; time.Now().Before(deadline); n++ {
		e.ingested(t, a.submit(t, "metering"))
	}
	for k := range e.ingest.ByKey() {
		if k.Epoch != r.Epoch {
			t.Fatalf("a delivery under epoch %d (%+v), want all %d under the first, %d: the lease ran out between slow renewals", k.Epoch, k, n, r.Epoch)
		}
	}
}

// A holder whose fence answers come too late (it stalled, or was frozen,
// between its fence and its send: here the fake answers 150ms after it
// decided, over half the 200ms renewal cadence) does not send under them;
// once the answers are fresh again the bundle goes, under its epoch.
func TestHolderDoesNotSendOnALateFence(t *testing.T) {
	e := newEnv(t, 600*time.Millisecond)
	a := e.startEdge("edge-a", org, edgeOpts{})
	r := a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	e.control.SetFenceDelay(150 * time.Millisecond)
	id := a.submit(t, "metering")
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := a.route("metering"); !strings.Contains(got.LastError, "not sending under them") {
			return fmt.Errorf("route %+v: no late fence refused yet", got)
		}
		return nil
	})
	if _, ok := e.ingest.Bundle(id); ok {
		t.Fatal("a bundle was sent under a fence answered too late")
	}
	e.control.SetFenceDelay(0)
	e.ingested(t, id)
	got := a.route("metering")
	for k := range e.ingest.ByKey() {
		if k.Epoch != got.Epoch || k.Epoch < r.Epoch {
			t.Fatalf("delivered under %+v, want the holder's current epoch %d", k, got.Epoch)
		}
	}
}

// A holder cut off from the control API (its renewals hang) does not say
// it holds the lease once the lease has run out: its route reads unknown,
// with the reason, from the moment of expiry. Before, it said direct (and
// its holder metric 1) for the whole partition, beside the new holder's.
func TestHolderCutOffStopsClaimingAnExpiredLease(t *testing.T) {
	e := newEnv(t, 1500*time.Millisecond)
	a := e.startEdge("edge-a", org, edgeOpts{})
	r := a.awaitRoute(t, "metering", edgeapi.RouteDirect)
	if r.Expires == nil {
		t.Fatalf("route %+v without an expiry", r)
	}
	e.control.SetElectDelay(time.Minute) // every renewal hangs until its timeout
	expiry := *r.Expires
	for {
		cur := a.route("metering")
		if cur.Expires != nil && cur.Expires.After(expiry) {
			expiry = *cur.Expires // renewed before the partition took hold
		}
		if time.Now().After(expiry.Add(50 * time.Millisecond)) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the wall clock passing the expiry is the condition
	}
	if cur := a.route("metering"); cur.Route == edgeapi.RouteDirect || !strings.Contains(cur.Reason, "lease expired") {
		t.Errorf("route %+v after its lease expired at %s: want unknown with the reason", cur, expiry)
	}
}

// pending reports whether ed's journal still holds bundle id.
func (ed *edge) pending(class, id string) bool {
	for _, b := range ed.journal.Pending(class) {
		if b.ID == id {
			return true
		}
	}
	return false
}

// A holder whose edge the control API deleted (its certificate refused,
// 401) sends nothing more: its fence is refused, its route turns refused
// (stage identity) and its bundles stay journaled.
func TestRefusedHolderStopsSending(t *testing.T) {
	e, a, _ := twoEdges(t)
	e.control.Remove("edge-a")
	id := a.submit(t, "metering")
	r := a.awaitRoute(t, "metering", edgeapi.RouteRefused)
	if r.Stage != stageIdentity || r.Reason != reasonEdgeRefused || !strings.Contains(r.LastError, "401") {
		t.Fatalf("route %+v: want refused at %s: %s, with the 401", r, stageIdentity, reasonEdgeRefused)
	}
	if !a.pending("metering", id) {
		t.Fatalf("bundle %s left the journal of a refused edge", id)
	}
	if _, ok := e.ingest.Bundle(id); ok || len(e.ingest.ByKey()) != 0 {
		t.Fatalf("a refused edge delivered: %+v", e.ingest.ByKey())
	}
}

// A peer whose edge the control API deleted does not fall back to sending
// direct when the holder's intake refuses it (403: the control API does
// not know it as an edge of the org): it asks the control API, is refused
// (401), and keeps its bundles journaled. Before, it sent them straight to
// the destination with epoch 0.
func TestRefusedPeerDoesNotFallBackDirect(t *testing.T) {
	e, a, b := twoEdges(t)
	e.control.Remove("edge-b")
	id := b.submit(t, "metering")
	r := b.awaitRoute(t, "metering", edgeapi.RouteRefused)
	if r.Stage != stageIdentity || r.Reason != reasonEdgeRefused || r.Fallback != 0 || r.Forwarded != 0 {
		t.Fatalf("route %+v: want refused at %s: %s, nothing forwarded or sent direct", r, stageIdentity, reasonEdgeRefused)
	}
	if !b.pending("metering", id) {
		t.Fatalf("bundle %s left the journal of a refused edge", id)
	}
	if _, ok := e.ingest.Bundle(id); ok || len(e.ingest.ByKey()) != 0 {
		t.Fatalf("a refused edge's bundle was delivered: %+v", e.ingest.ByKey())
	}
	// The holder answered the forward 403 and took nothing.
	if n := len(a.journal.Pending("metering")); n != 0 {
		t.Fatalf("the holder journaled %d bundles of a refused peer", n)
	}
	bd, err := NewBundle(org, b.id, "metering", time.Now(), []Metering{{Cell: "cell-01", Requests: 1}})
	if err != nil {
		t.Fatal(err)
	}
	code, reason, err := postIntake(t, a, b.id, bd, peerTLS(t, b.identity))
	if err != nil || code != http.StatusForbidden || !strings.Contains(reason, "peer_not_in_org") {
		t.Fatalf("forward of a deleted edge: HTTP %d %q, %v; want 403 peer_not_in_org", code, reason, err)
	}
}
