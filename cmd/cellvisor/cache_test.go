package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/config"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// originCounter is a loopback origin that counts the requests reaching it,
// by path.
type originCounter struct {
	mu   sync.Mutex
	hits map[string]int
}

func (o *originCounter) count(path string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.hits[path]
}

// A domain's cache.ttl_seconds is applied in its cell: repeated GETs are
// answered from the cache (no-store and Set-Cookie answers are not), the
// cell counts hits and misses, the cache survives the reload that adds an
// unrelated domain and a new cell, and a domain moved to another cell
// starts cold there.
func TestCacheLocality(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	spoolDir := filepath.Join(t.TempDir(), "spool")
	cfgPath, cfg := agentConfig(t, 3, fmt.Sprintf("source:\n  dir: %s\n  poll_interval: 100ms\n  max_backoff: 500ms\n", spoolDir))
	sp := newSpool(t, cfg, spoolDir)
	o := &originCounter{hits: map[string]int{}}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.hits[r.URL.Path]++
		n := o.hits[r.URL.Path]
		o.mu.Unlock()
		switch r.URL.Path {
		case "/no-store":
			w.Header().Set("Cache-Control", "no-store")
		case "/cookie":
			w.Header().Set("Set-Cookie", "s=1")
		}
		fmt.Fprintf(w, "%s #%d", r.URL.Path, n)
	}))
	t.Cleanup(origin.Close)
	cached := func(cells ...string) pubDomain {
		return pubDomain{name: "cached.test", pool: "shared-default", cells: cells,
			doc: fmt.Sprintf(`"origins":[{"name":"o","url":%q}],"routes":[{"prefix":"/","origin":"o"}],"cache":{"ttl_seconds":300}`, origin.URL)}
	}
	one := &manifest.Assignments{Cells: map[string]string{"cell-01": "shared-default"},
		Pools: map[string]manifest.PoolPolicy{"shared-default": sharedPolicy}}
	sp.publishPlaced(t, 1, one, cached())
	_, st := startAgent(t, bin, cfgPath, cfg)
	p1, p3 := st.Slots[0].HTTPPort, st.Slots[2].HTTPPort
	awaitAck(t, sp, 1, manifest.AckApplied)

	body := func(port int, path string) string {
		t.Helper()
		code, b, err := get(port, "cached.test", path)
		if err != nil || code != 200 {
			t.Fatalf("GET %s on %d: %d %v", path, port, code, err)
		}
		return b
	}
	for i := range 3 {
		if b := body(p1, "/page"); b != "/page #1" {
			t.Fatalf("request %d of /page: %q, want the first origin answer from the cache", i+1, b)
		}
		body(p1, "/no-store")
		body(p1, "/cookie")
	}
	if n, m := o.count("/no-store"), o.count("/cookie"); n != 3 || m != 3 {
		t.Errorf("origin saw /no-store %d and /cookie %d times, want 3 each: they must not be cached", n, m)
	}
	c := slotStatus(t, cfg, "cell-01").Cell
	// Every request that went to the origin is a miss, stored or not: the
	// first /page and the six uncacheable ones.
	if c == nil || c.Cache.Miss != 7 || c.Cache.Hit != 2 {
		t.Fatalf("cell-01 cache counters %+v, want 7 misses and 2 hits", c)
	}
	if len(c.Origins) != 0 {
		t.Errorf("cache hits recorded as origin failures: %+v", c.Origins)
	}

	// An unrelated domain and a new cell: cell-01's content changes (a
	// reload), its cache stays.
	two := &manifest.Assignments{Cells: map[string]string{"cell-01": "shared-default", "cell-03": "shared-default"},
		Pools: map[string]manifest.PoolPolicy{"shared-default": sharedPolicy}}
	other := pubDomain{name: "other.test", pool: "shared-default", doc: respond("other")}
	sp.publishPlaced(t, 2, two, cached("cell-01"), other)
	awaitAck(t, sp, 2, manifest.AckApplied)
	awaitReloaded(t, cfg, "cell-01")
	awaitServed(t, p3, "other.test", "other")
	awaitServed(t, p1, "other.test", "other")
	if b := body(p1, "/page"); b != "/page #1" || o.count("/page") != 1 {
		t.Errorf("after an unrelated change /page is %q (origin saw it %d times): the cache was lost", b, o.count("/page"))
	}
	// A cell that caches nothing has no cache zone, so no cache manager.
	if n := cacheManagers(t, cfg, "cell-03"); n != 0 {
		t.Errorf("cell-03 caches nothing but runs %d cache managers", n)
	}

	// Moved to cell-03: cold there (one more origin request), then cached.
	sp.publishPlaced(t, 3, two, cached("cell-03"), other)
	awaitAck(t, sp, 3, manifest.AckApplied)
	awaitReloaded(t, cfg, "cell-01")
	awaitReloaded(t, cfg, "cell-03")
	testutil.Eventually(t, 10*time.Second, func() error {
		if n := cacheManagers(t, cfg, "cell-03"); n != 1 {
			return fmt.Errorf("cell-03 runs %d cache managers after its reload, want 1", n)
		}
		return nil
	})
	if b := body(p3, "/page"); b != "/page #2" {
		t.Errorf("first /page on cell-03: %q, want a miss (/page #2)", b)
	}
	if b := body(p3, "/page"); b != "/page #2" {
		t.Errorf("second /page on cell-03: %q, want the cached /page #2", b)
	}
	if code, _, _ := get(p1, "cached.test", "/page"); code != 404 {
		t.Errorf("cell-01 still serves the moved domain: %d", code)
	}
	if c := slotStatus(t, cfg, "cell-03").Cell; c == nil || c.Cache.Miss != 1 || c.Cache.Hit != 1 {
		t.Errorf("cell-03 cache counters %+v, want 1 miss and 1 hit", c)
	}
}

// cacheManagers counts the cache manager processes among the children of
// cell's master.
func cacheManagers(t *testing.T, cfg config.Agent, cell string) int {
	t.Helper()
	pid := slotStatus(t, cfg, cell).PID
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, child := range strings.Fields(string(b)) {
		title, _ := os.ReadFile("/proc/" + child + "/cmdline")
		if strings.Contains(string(title), "cache manager process") {
			n++
		}
	}
	return n
}
