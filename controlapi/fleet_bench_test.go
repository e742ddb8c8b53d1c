package controlapi_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/fleet"
	"cellvisor/controlapi/pki"
	"cellvisor/controlapi/store"
)

// BenchmarkFleetPage10000 serves the fleet page's first page, the
// silent edges' first page, and a /metrics scrape (a last-seen and a
// ready-cells series per edge, each report decoded), of a fleet of 10,000
// enrolled edges that each reported 8 cells and none of which has been
// seen since: every one is silent, the worst case for the silent count.
// Every tenth edge has a cell on a superseded runtime (the page's runtime
// summary lists 20 of them).
func BenchmarkFleetPage10000(b *testing.B) {
	const edges = 10000
	key := make([]byte, 32)
	rand.Read(key)
	// The control API's clock runs past the silence limit: the reports
	// below are the last the edges sent.
	e := serveWith(b, filepath.Join(b.TempDir(), "control.db"), key, func(o *controlapi.Options) {
		o.Now = func() time.Time { return time.Now().Add(fleet.SilentAfter + time.Minute) }
	})
	reportOf := func(superseded bool) []byte {
		var status struct {
			Runtime map[string]any   `json:"runtime"`
			Slots   []map[string]any `json:"slots"`
		}
		status.Runtime = map[string]any{"version": "nginx/1.22.2", "superseded": 0}
		for i := 1; i <= 8; i++ {
			rt := map[string]any{"version": "nginx/1.22.2"}
			if superseded && i == 1 {
				rt = map[string]any{"version": "nginx/1.22.1", "superseded": true, "current": "nginx/1.22.2"}
				status.Runtime["superseded"], status.Runtime["upgrade"] = 1, "waiting"
			}
			status.Slots = append(status.Slots, map[string]any{"name": fmt.Sprintf("cell-%02d", i), "pool": "shared-default", "state": "ready", "sequence": 1, "runtime": rt})
		}
		b, _ := json.Marshal(status)
		return b
	}
	current, old := reportOf(false), reportOf(true)
	// An edge's creation signs its first manifest with the control API's
	// key, sealed with key.
	signer := func(sealed string) (ed25519.PrivateKey, error) {
		seed, err := pki.Open(key, "signing-key", sealed)
		if err != nil {
			return nil, err
		}
		return ed25519.NewKeyFromSeed(seed), nil
	}
	for i := range edges {
		report := current
		if i%10 == 0 {
			report = old
		}
		id := fmt.Sprintf("edge-%05d", i)
		if _, err := e.st.CreateEdge(ctx(b), store.NewEdge{ID: id, Name: id, Org: "acme", Country: "DE", Continent: "EU", Slots: 8,
			TokenHash: "tok-" + id, Assignments: map[string]string{"cell-01": "shared-default"}}, signer); err != nil {
			b.Fatal(err)
		}
		if err := e.st.Enroll(ctx(b), id, "tok-"+id, "csr", "cert", "serial-"+id); err != nil {
			b.Fatal(err)
		}
		if err := e.st.PutStatus(ctx(b), id, store.Report{Status: report, At: time.Now()}); err != nil {
			b.Fatal(err)
		}
	}
	for _, path := range []string{fleet.Path, fleet.Path + "?silent=1", controlapi.PathMetrics} {
		b.Run(path, func(b *testing.B) {
			var size int
			for b.Loop() {
				req, _ := http.NewRequestWithContext(ctx(b), http.MethodGet, e.admin.URL+path, nil)
				req.Header.Set("Authorization", "Bearer "+e.admin.Token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatal(resp.Status)
				}
				if size = int(n); size < 100<<10 {
					b.Fatalf("a page of %d bytes: not 200 edges", size)
				}
			}
			b.ReportMetric(float64(size)/1024, "KiB/page")
		})
	}
}
