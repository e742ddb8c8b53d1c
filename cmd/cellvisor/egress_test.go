package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/cellapi"
	"cellvisor/config"
	"cellvisor/controlapi/adminapi"
	"cellvisor/edgeapi"
	"cellvisor/outbound/outboundtest"
	"cellvisor/testkit/corpingest"
	"cellvisor/testkit/testutil"
)

// egressFront stands between an enrolled agent and its real control API:
// the egress paths (elect, fence) go to a fake that speaks the contract,
// everything else to the real control API, over mutual TLS with the
// edge's own identity. The agent trusts the front's CA instead of the
// control API's (its server-ca.pem is replaced).
// frontEgress starts a corp ingest and, for the enrolled edge id of org
// acme with intake as its egress intake, a fake of the egress paths that
// sends there; it points the agent's identity at an egressFront before
// them. It returns the ingest and the fake.
func frontEgress(t *testing.T, c *control, cfg config.Agent, id agent.Identity, intake string) (*corpingest.Server, *outboundtest.Control) {
	t.Helper()
	ingest := corpingest.New()
	dest := httptest.NewServer(ingest)
	t.Cleanup(dest.Close)
	fake := outboundtest.NewControl(dest.URL+"/ingest", 2*time.Second)
	fake.Add(id.EdgeID, "acme", "https://"+intake)
	front, frontCA := egressFront(t, c.ep.EdgeURL, cfg.IdentityDir(), fake)
	id.ControlURL = front
	data, err := json.Marshal(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Identity(), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.IdentityDir(), "server-ca.pem"), frontCA.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return ingest, fake
}

func egressFront(t *testing.T, realURL, identityDir string, fake *outboundtest.Control) (frontURL string, ca *outboundtest.CA) {
	t.Helper()
	ca = outboundtest.NewCA(t, "front CA")
	edgeCA, err := os.ReadFile(filepath.Join(identityDir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	serverCA, err := os.ReadFile(filepath.Join(identityDir, "server-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	edgeRoots, serverRoots := x509.NewCertPool(), x509.NewCertPool()
	edgeRoots.AppendCertsFromPEM(edgeCA)
	serverRoots.AppendCertsFromPEM(serverCA)
	target, _ := url.Parse(realURL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: serverRoots, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(filepath.Join(identityDir, "cert.pem"), filepath.Join(identityDir, "key.pem"))
		return &c, err
	}}}
	t.Cleanup(tr.CloseIdleConnections)
	proxy.Transport = tr
	mux := http.NewServeMux()
	mux.Handle("/v1/egress/", fake.Handler())
	mux.Handle("/", proxy)
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.ServerCert(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: edgeRoots}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL, ca
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// A real agent, enrolled with a real control API that names its org,
// sends its cells' request counts as metering and their refused private
// calls as siem_forwarding, direct as the elected holder; with elections
// refused its bundles stay journaled across a SIGKILL and are delivered by
// the next agent.
func TestAgentEgressOnRealCells(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	intake := freeAddr(t)
	cfgPath, cfg := agentConfig(t, 1, fmt.Sprintf("source:\n  poll_interval: 100ms\n  max_backoff: 400ms\n  status_interval: 200ms\negress:\n  intake_listen: %s\n  interval: 200ms\n  max_renew: 1s\n", intake))
	c.enroll(t, bin, cfgPath, adminapi.EdgeRequest{Name: "egress", Org: "acme", Country: "NL", Continent: "EU", Slots: 1})
	id, _, err := agent.LoadIdentity(cfg.Identity())
	if err != nil {
		t.Fatal(err)
	}
	if id.Org != "acme" {
		t.Fatalf("identity org %q: want the org the control API named at enrollment", id.Org)
	}

	ingest, fake := frontEgress(t, c, cfg, id, intake)

	c.publish(t, "v1")
	a, st := startAgent(t, bin, cfgPath, cfg)
	port := st.Slots[0].HTTPPort
	awaitBody(t, port, "v1")
	route := awaitEgressRoute(t, cfg, "metering", edgeapi.RouteDirect)
	if route.Holder != id.EdgeID || route.Epoch < 1 {
		t.Fatalf("metering route %+v: want held by this edge", route)
	}

	// Requests on the cell are metered; refused private calls forwarded.
	for range 5 {
		if _, err := appBody(port); err != nil {
			t.Fatal(err)
		}
	}
	refusedCalls := badPrivateCalls(t, cfg.RunDir, 3)
	testutil.Eventually(t, 30*time.Second, func() error {
		if n := sumItems(t, ingest, "siem_forwarding", func(m map[string]any) float64 { return m["count"].(float64) }); n != float64(refusedCalls) {
			return fmt.Errorf("security events ingested count %v refused calls, want %d", n, refusedCalls)
		}
		if n := sumItems(t, ingest, "metering", func(m map[string]any) float64 { return m["requests"].(float64) }); n < 5 {
			return fmt.Errorf("metering ingested %v requests, want at least the 5 made", n)
		}
		return nil
	})
	for k := range ingest.ByKey() {
		if k.Sender != id.EdgeID || k.Epoch < 1 {
			t.Fatalf("delivery %+v: want the holder's, under its epoch", k)
		}
	}
	out, err := runCLI(t, bin, "--config", cfgPath, "status")
	if err != nil || !strings.Contains(out, "egress: org acme, intake https://"+intake) ||
		!regexpLine(out, `siem_forwarding\s+direct\s+`+id.EdgeID+` \(alone\)\s+\d+\s+in \d+s\s+yes`) {
		t.Fatalf("status: %v\n%s", err, out)
	}

	// Elections refused: the next security events stay journaled, and a
	// SIGKILL loses none of them.
	fake.Refuse("hard requirement region=mars matches no live edge")
	awaitEgressRoute(t, cfg, "siem_forwarding", edgeapi.RouteRefused)
	before := ingest.Class("siem_forwarding").Unique
	more := badPrivateCalls(t, cfg.RunDir, 2)
	testutil.Eventually(t, 30*time.Second, func() error {
		if r := egressRoute(t, cfg, "siem_forwarding"); r.Pending < 1 {
			return fmt.Errorf("no security bundle journaled yet: %+v", r)
		}
		return nil
	})
	a.kill9(t)
	if got := ingest.Class("siem_forwarding").Unique; got != before {
		t.Fatalf("a bundle was delivered while elections were refused: %d, was %d", got, before)
	}
	fake.Refuse("")
	startAgent(t, bin, cfgPath, cfg)
	testutil.Eventually(t, 30*time.Second, func() error {
		if n := sumItems(t, ingest, "siem_forwarding", func(m map[string]any) float64 { return m["count"].(float64) }); n != float64(refusedCalls+more) {
			return fmt.Errorf("security events ingested count %v refused calls, want %d", n, refusedCalls+more)
		}
		return nil
	})
	if tot := ingest.Total(); tot.Duplicate != 0 {
		t.Logf("duplicates delivered (harmless): %+v", tot)
	}
}

// egressRoute is class's route in the agent's status.
func egressRoute(t testing.TB, cfg config.Agent, class string) edgeapi.RouteStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := adminsock.FetchStatus(ctx, agent.AdminSocket(cfg))
	if err != nil || st.Egress == nil {
		return edgeapi.RouteStatus{}
	}
	for _, r := range st.Egress.Routes {
		if r.Class == class {
			return r
		}
	}
	return edgeapi.RouteStatus{}
}

func awaitEgressRoute(t *testing.T, cfg config.Agent, class, mode string) edgeapi.RouteStatus {
	t.Helper()
	var r edgeapi.RouteStatus
	testutil.Eventually(t, 30*time.Second, func() error {
		if r = egressRoute(t, cfg, class); r.Route != mode {
			return fmt.Errorf("%s route %+v, want %s", class, r, mode)
		}
		return nil
	})
	return r
}

func regexpLine(out, pattern string) bool {
	return regexp.MustCompile(`(?m)^` + pattern).MatchString(out)
}

// badPrivateCalls calls cell-01's private endpoint n times with a wrong
// secret: n refused calls, each a security event.
func badPrivateCalls(t *testing.T, runDir string, n int) int {
	t.Helper()
	cl := cellapi.New(filepath.Join(runDir, "cell-01", "private.sock"), []byte("not the cell's secret, not at all"))
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cl.Status(ctx)
		cancel()
		if err == nil {
			t.Fatal("a call with a wrong secret was answered")
		}
	}
	return n
}

// sumItems sums a number of every item of every ingested bundle of class.
func sumItems(t *testing.T, in *corpingest.Server, class string, f func(map[string]any) float64) float64 {
	t.Helper()
	var n float64
	for bid := range in.IDs() {
		b, _ := in.Bundle(bid)
		if b.Class != class {
			continue
		}
		var items []map[string]any
		if err := json.Unmarshal(b.Items, &items); err != nil {
			t.Fatalf("bundle %s items: %v", bid, err)
		}
		for _, it := range items {
			n += f(it)
		}
	}
	return n
}
