package controlapi_test

import (
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
	"cellvisor/edgeapi"
)

func refusal(t *testing.T, err error) *adminapi.Error {
	t.Helper()
	var ae *adminapi.Error
	if !errors.As(err, &ae) {
		t.Fatalf("want an admin refusal, got %v", err)
	}
	return ae
}

// TestFrontDoorAdmin: set (normalized), list, resolve with each refusal's
// stable reason and status, one URL to one edge, clear.
func TestFrontDoorAdmin(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		a, b := e.createEdge(t, "fra-1"), e.createEdge(t, "fra-2")
		v, err := e.admin.SetFrontDoor(ctx(t), a.Edge.ID, adminapi.FrontDoorRequest{URL: "HTTPS://Shop.Example.COM./cart"})
		if err != nil || v.URL != "https://shop.example.com:443" || v.EdgeID != a.Edge.ID || v.Service != "https" || v.Org != "acme" {
			t.Fatalf("set: %+v, %v", v, err)
		}
		if _, err := e.admin.SetFrontDoor(ctx(t), b.Edge.ID, adminapi.FrontDoorRequest{URL: "https://shop.example.com:443"}); refusal(t, err).Status != http.StatusConflict {
			t.Fatalf("a second edge took the URL: %v", err)
		}
		if _, err := e.admin.SetFrontDoor(ctx(t), b.Edge.ID, adminapi.FrontDoorRequest{URL: "https://user@api.example.com"}); refusal(t, err).Status != http.StatusBadRequest {
			t.Fatalf("a malformed URL was stored: %v", err)
		}
		if _, err := e.admin.SetFrontDoor(ctx(t), "no-such-edge", adminapi.FrontDoorRequest{URL: "https://x.example.com"}); refusal(t, err).Status != http.StatusNotFound {
			t.Fatalf("unknown edge: %v", err)
		}
		if _, err := e.admin.SetFrontDoor(ctx(t), b.Edge.ID, adminapi.FrontDoorRequest{URL: "https://xn--bcher-kva.example", Service: "http"}); err != nil {
			t.Fatal(err)
		}
		list, err := e.admin.FrontDoors(ctx(t), "acme")
		if err != nil || len(list) != 2 || list[0].URL != "https://shop.example.com:443" || list[1].EdgeID != b.Edge.ID {
			t.Fatalf("list: %+v, %v", list, err)
		}
		r, err := e.admin.Resolve(ctx(t), "https://bücher.example/x", "")
		if err != nil || r.EdgeID != b.Edge.ID || r.Org != "acme" || r.Canonical != "https://xn--bcher-kva.example:443" {
			t.Fatalf("resolve: %+v, %v", r, err)
		}
		for _, c := range []struct {
			url, org, reason string
			status           int
		}{
			{"https://nobody.example.com", "", "unmapped", http.StatusNotFound},
			{"https://shop.example.com", "another-org", "unmapped", http.StatusNotFound},
			{"ftp://shop.example.com", "", "malformed", http.StatusBadRequest},
			{"https://127.0.0.1", "", "malformed", http.StatusBadRequest},
		} {
			_, err := e.admin.Resolve(ctx(t), c.url, c.org)
			if ae := refusal(t, err); ae.Reason != c.reason || ae.Status != c.status {
				t.Errorf("resolve %s in %q: %d %q, want %d %q", c.url, c.org, ae.Status, ae.Reason, c.status, c.reason)
			}
		}
		if err := e.admin.ClearFrontDoor(ctx(t), a.Edge.ID); err != nil {
			t.Fatal(err)
		}
		if err := e.admin.ClearFrontDoor(ctx(t), a.Edge.ID); refusal(t, err).Status != http.StatusNotFound {
			t.Fatalf("second clear: %v", err)
		}
		if _, err := e.admin.Resolve(ctx(t), "https://shop.example.com", ""); refusal(t, err).Reason != "unmapped" {
			t.Fatalf("resolve after clear: %v", err)
		}
	})
}

// TestFrontDoorCorruptRowRefuses: a row damaged in the database (not
// canonical) makes every resolve refuse as corrupt_row, never a guess.
func TestFrontDoorCorruptRowRefuses(t *testing.T) {
	e := start(t, t.TempDir()+"/control.db")
	a := e.createEdge(t, "fra-1")
	b := e.createEdge(t, "fra-2")
	if _, err := e.admin.SetFrontDoor(ctx(t), a.Edge.ID, adminapi.FrontDoorRequest{URL: "https://shop.example.com"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.SetFrontDoor(ctx(t), b.Edge.ID, adminapi.FrontDoorRequest{URL: "https://api.example.com"}); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+e.dsn+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE gateways SET front_door_url = 'https://API.example.com' WHERE edge_id = ?`, b.Edge.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.admin.Resolve(ctx(t), "https://shop.example.com", "")
	if ae := refusal(t, err); ae.Reason != "corrupt_row" || ae.Status != http.StatusConflict {
		t.Fatalf("resolve with a corrupt row: %d %q", ae.Status, ae.Reason)
	}
}

// TestFrontDoorSyncAndEdgeFetch: an agent's status report refreshes its
// gateways and never its front door (a report cannot even carry one); the
// edge fetches its org's front doors, cheaply (304) when unchanged, and
// never another org's.
func TestFrontDoorSyncAndEdgeFetch(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		created := e.createEdge(t, "fra-1")
		cl, id, dir := e.enroll(t, created.Token)
		other, err := e.admin.CreateEdge(ctx(t), adminapi.EdgeRequest{Name: "other", Org: "globex", Country: "de", Continent: "eu"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.admin.SetFrontDoor(ctx(t), other.Edge.ID, adminapi.FrontDoorRequest{URL: "https://globex.example.com"}); err != nil {
			t.Fatal(err)
		}
		body, tag, err := cl.FrontDoors(ctx(t), "")
		var fd edgeapi.FrontDoors
		if err != nil || json.Unmarshal(body, &fd) != nil || fd.Org != "acme" || len(fd.Rows) != 0 || tag == "" {
			t.Fatalf("first fetch: %s %q %v", body, tag, err)
		}
		if _, _, err := cl.FrontDoors(ctx(t), tag); !errors.Is(err, controlclient.ErrNotModified) {
			t.Fatalf("unchanged fetch: %v", err)
		}
		if _, err := e.admin.SetFrontDoor(ctx(t), id.EdgeID, adminapi.FrontDoorRequest{URL: "https://shop.example.com"}); err != nil {
			t.Fatal(err)
		}
		body, tag2, err := cl.FrontDoors(ctx(t), tag)
		if err != nil || tag2 == tag || json.Unmarshal(body, &fd) != nil || len(fd.Rows) != 1 ||
			fd.Rows[0] != (edgeapi.FrontDoorRow{Edge: id.EdgeID, URL: "https://shop.example.com:443"}) {
			t.Fatalf("fetch after set: %s %q %v", body, tag2, err)
		}

		report := func(gws []edgeapi.Gateway) error {
			return cl.Report(ctx(t), edgeapi.StatusReport{At: time.Now(), Status: json.RawMessage(`{"slots":[]}`), Gateways: gws})
		}
		gws := []edgeapi.Gateway{
			{Service: "http", Protocol: "http", Host: "127.0.0.1", Port: 8080, Region: "eu-central", Zone: "a", Locality: "fra", RTTMicros: 900, Healthy: true},
			{Service: "https", Protocol: "https", Host: "127.0.0.1", Port: 8443, TLS: true, Region: "eu-central", Zone: "a", Locality: "fra", RTTMicros: 900, Healthy: true},
		}
		for range 2 {
			if err := report(gws); err != nil {
				t.Fatal(err)
			}
		}
		list, err := e.admin.FrontDoors(ctx(t), "acme")
		if err != nil || len(list) != 1 || list[0].URL != "https://shop.example.com:443" || list[0].Port != 8443 ||
			!list[0].Healthy || list[0].Region != "eu-central" || list[0].RTTMicros != 900 || list[0].LastSeen == nil {
			t.Fatalf("after reports: %+v, %v", list, err)
		}
		// A report whose gateway names a front door is refused whole: the
		// field does not exist on the wire.
		forged := `{"at":"2026-01-01T00:00:00Z","status":{"slots":[]},"gateways":[{"service":"https","front_door_url":"https://forged.example.com:443"}]}`
		if code := rawEdgePost(t, e, dir, edgeapi.PathStatus, forged); code != http.StatusBadRequest {
			t.Fatalf("forged report: %d", code)
		}
		// The same report without the field is taken: the field is the refusal.
		if code := rawEdgePost(t, e, dir, edgeapi.PathStatus, strings.Replace(forged, `,"front_door_url":"https://forged.example.com:443"`, "", 1)); code != http.StatusNoContent {
			t.Fatalf("report without the forged field: %d", code)
		}
		var he *controlclient.HTTPError
		if err := report([]edgeapi.Gateway{{Service: "bad service"}}); !errors.As(err, &he) || he.Status != http.StatusBadRequest {
			t.Fatalf("invalid gateway: %v", err)
		}
		// Unhealthy and in another zone: refreshed, the front door kept.
		gws[1].Healthy, gws[1].Zone = false, "b"
		if err := report(gws); err != nil {
			t.Fatal(err)
		}
		list, err = e.admin.FrontDoors(ctx(t), "acme")
		if err != nil || len(list) != 1 || list[0].URL != "https://shop.example.com:443" || list[0].Healthy || list[0].Zone != "b" {
			t.Fatalf("after an unhealthy report: %+v, %v", list, err)
		}
	})
}

// rawEdgePost posts body to the edge API with the identity enrolled into
// dir, as no agent would, and returns the status.
func rawEdgePost(t *testing.T, e *env, dir, path, body string) int {
	t.Helper()
	id := filepath.Join(dir, "identity")
	cert, err := tls.LoadX509KeyPair(filepath.Join(id, controlclient.CertFile), filepath.Join(id, controlclient.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(e.srv.CAPEM()))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, e.edgeURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// BenchmarkFrontDoorPoll304: an edge's unchanged front-door poll (mTLS,
// kept-alive connection, SQLite), with its org's 100 front doors.
func BenchmarkFrontDoorPoll304(b *testing.B) {
	e := start(b, b.TempDir()+"/control.db")
	created := e.createEdge(b, "bench")
	cl, _, _ := e.enroll(b, created.Token)
	for i := range 100 {
		c := e.createEdge(b, fmt.Sprintf("fd-%03d", i))
		if _, err := e.admin.SetFrontDoor(ctx(b), c.Edge.ID, adminapi.FrontDoorRequest{URL: fmt.Sprintf("https://shop-%03d.example.com", i)}); err != nil {
			b.Fatal(err)
		}
	}
	_, tag, err := cl.FrontDoors(ctx(b), "")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := cl.FrontDoors(ctx(b), tag); !errors.Is(err, controlclient.ErrNotModified) {
			b.Fatal(err)
		}
	}
}

// TestConcurrentFrontDoorSets: operators setting front doors at once, on
// the same edge (other URLs, other services) and the same URLs on other
// edges: every call answers 200 with the row as it set it, or 409 naming
// the edge that holds the URL; never 500 (a deadlock on PostgreSQL, "set
// but not read back" on SQLite before). The rules hold after: one URL to
// one edge, one front door per edge.
func TestConcurrentFrontDoorSets(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		edges := []adminapi.CreatedEdge{e.createEdge(t, "fra-1"), e.createEdge(t, "fra-2"), e.createEdge(t, "fra-3")}
		names := map[string]string{}
		for _, c := range edges {
			names[c.Edge.ID] = c.Edge.Name
		}
		const calls = 120
		type outcome struct {
			edge, url string
			view      adminapi.FrontDoorView
			err       error
		}
		out := make(chan outcome, calls)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range calls {
			edge := edges[i%len(edges)].Edge.ID
			url := fmt.Sprintf("https://door-%d.example.com:443", (i/len(edges))%4)
			svc := []string{"https", "http", "api"}[(i/7)%3]
			wg.Go(func() {
				<-start
				v, err := e.admin.SetFrontDoor(ctx(t), edge, adminapi.FrontDoorRequest{URL: url, Service: svc})
				out <- outcome{edge: edge, url: url, view: v, err: err}
			})
		}
		close(start)
		wg.Wait()
		close(out)
		set, refused := 0, 0
		for o := range out {
			var ae *adminapi.Error
			switch {
			case o.err == nil:
				set++
				if o.view.EdgeID != o.edge || o.view.URL != o.url {
					t.Errorf("set %s on %s answered %+v", o.url, o.edge, o.view)
				}
			case errors.As(o.err, &ae) && ae.Status == http.StatusConflict:
				refused++
				named := false
				for id, name := range names {
					if id != o.edge && strings.Contains(ae.Message, "edge "+id+" ("+name+") holds it") {
						named = true
					}
				}
				if !named {
					t.Errorf("409 for %s on %s does not name the edge holding it: %s", o.url, o.edge, ae.Message)
				}
			default:
				t.Errorf("set %s on %s: %v", o.url, o.edge, o.err)
			}
		}
		t.Logf("%d set, %d refused (409, holder named)", set, refused)
		list, err := e.admin.FrontDoors(ctx(t), "")
		if err != nil || len(list) == 0 || len(list) > len(edges) {
			t.Fatalf("front doors after: %+v, %v", list, err)
		}
		urls, per := map[string]bool{}, map[string]bool{}
		for _, v := range list {
			if urls[v.URL] || per[v.EdgeID] {
				t.Errorf("a URL or an edge twice: %+v", list)
			}
			urls[v.URL], per[v.EdgeID] = true, true
		}
	})
}
