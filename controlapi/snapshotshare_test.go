package controlapi_test

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/edgeapi"
	"cellvisor/testkit/testutil"
)

// One edge opens as many snapshot downloads as the replica serves and
// reads none of them (issue 32 §3: it held all 16 slots for up to 5
// minutes, and every other org's edge got 503). Now an edge holds at most
// its share, its further downloads are answered 429, an edge of another
// org is served meanwhile, and a download slower than the minimum rate is
// cut, which frees its slot.
func TestSnapshotSlotsAreShared(t *testing.T) {
	const slots = 4
	e := serveWith(t, filepath.Join(t.TempDir(), "control.db"), make([]byte, 32), func(o *controlapi.Options) {
		o.SnapshotDownloads = slots
		o.SnapshotMinRate = 4 << 20 // bytes/s: a download that reads nothing is cut within seconds
	})
	_, _, greedy := e.enroll(t, e.createEdge(t, "greedy").Token)
	other, err := e.admin.CreateEdge(ctx(t), adminapi.EdgeRequest{Name: "other", Org: "globex", Country: "de", Continent: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	_, _, otherDir := e.enroll(t, other.Token)
	// Bigger than loopback's socket buffers hold: a download not read
	// stays under way.
	publishBig(t, e, 24, 1000<<10)
	if _, err := e.admin.Publish(ctx(t), "globex.example.com", adminapi.DomainRequest{Pool: "shared-default",
		Config: []byte(`{"hostnames":["globex.example.com"],"routes":[{"prefix":"/","respond":{"status":200,"body":"g"}}]}`)}); err != nil {
		t.Fatal(err)
	}
	hc := e.rawEdgeClient(t, greedy)
	get := func(hc *http.Client) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodGet, e.edgeURL+edgeapi.PathSnapshot, nil)
		return hc.Do(req)
	}
	var codes []int
	for range slots {
		resp, err := get(hc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
			t.Logf("greedy download %d: %d %s (Retry-After %q)", len(codes), resp.StatusCode, body, resp.Header.Get("Retry-After"))
			if resp.Header.Get("Retry-After") == "" {
				t.Errorf("a refused download without Retry-After")
			}
		}
	}
	if codes[0] != http.StatusOK || codes[1] != http.StatusTooManyRequests {
		t.Errorf("one edge's %d concurrent downloads answered %v: want the first served, the others 429", slots, codes)
	}
	// Another org's edge is served while the greedy one holds its share.
	resp, err := get(e.rawEdgeClient(t, otherDir))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || n == 0 {
		t.Fatalf("another org's edge's download while one edge holds its downloads: %d (%d bytes), want 200", resp.StatusCode, n)
	}
	// The greedy edge's first download, not read, is cut at the minimum
	// rate: its slot comes back.
	testutil.Eventually(t, 60*time.Second, func() error {
		resp, err := get(hc)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("the greedy edge's next download: %d", resp.StatusCode)
		}
		return nil
	})
}
