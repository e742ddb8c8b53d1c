package controlapi_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/edgeapi"
	"cellvisor/egress"
)

// One edge electing in a loop (each election of the holder renews its
// lease: a database write) is answered 429 with Retry-After beyond its
// bucket, and the other edges of its org are not.
func TestElectFloodFromOneEdgeIsLimited(t *testing.T) {
	e := serveOn(t, filepath.Join(t.TempDir(), "control.db"), make([]byte, 32))
	if _, err := e.admin.SetEgressPolicy(ctx(t), "acme", "metering", adminapi.EgressPolicyRequest{Destination: egressDest}); err != nil {
		t.Fatal(err)
	}
	flood := e.egressEdge(t, "flood", "acme", "eu-west")
	other := e.egressEdge(t, "other", "acme", "eu-west")
	body, _ := json.Marshal(edgeapi.ElectRequest{Class: string(egress.Metering), Reachable: true})
	ok, limited := 0, 0
	start := time.Now()
	for range 200 {
		resp, err := flood.hc.Post(e.edgeURL+edgeapi.PathEgressElect, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			limited++
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 {
				t.Fatalf("429 with Retry-After %q: want seconds", resp.Header.Get("Retry-After"))
			}
		default:
			t.Fatalf("elect: HTTP %d", resp.StatusCode)
		}
	}
	// At most the burst plus what refilled while the loop ran.
	if most := 20 + int(time.Since(start).Seconds()*5) + 1; ok > most || limited == 0 {
		t.Fatalf("%d elections answered, %d limited: want at most %d answered", ok, limited, most)
	}
	if r := other.elect(t, egress.Metering, true); r.Class != string(egress.Metering) {
		t.Fatalf("the other edge's election: %+v", r)
	}
}
