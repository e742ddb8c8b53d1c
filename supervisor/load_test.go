package supervisor_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/agent"
	"cellvisor/cellapi"
	"cellvisor/config"
	"cellvisor/domain"
	"cellvisor/runtime"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// A publish that changes only data reaches a running cell without a new
// worker: the tests below publish releases to cell-01 of a one-slot
// harness as the activation does (built, installed and switched, then
// Apply), and watch what its connections see.

// streamOrigin is a loopback origin whose /stream answers a line every
// 20 ms until the client goes or the test ends; anything else answers "origin".
// Its /upgrade takes a client's Upgrade (as a WebSocket server does):
// 101, then it echoes every line back.
func streamOrigin(t *testing.T) *httptest.Server {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/upgrade" {
			echoUpgraded(w, r, stop)
			return
		}
		if r.URL.Path != "/stream" {
			io.WriteString(w, "origin")
			return
		}
		w.Header().Set("X-Accel-Buffering", "no") // nginx passes each line on at once
		f := w.(http.Flusher)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "line %d\n", i); err != nil {
				return
			}
			f.Flush()
			select {
			case <-tick.C:
			case <-r.Context().Done():
				return
			case <-stop:
				return
			}
		}
	}))
	t.Cleanup(func() { close(stop); srv.Close() })
	return srv
}

// echoUpgraded answers an Upgrade with 101 and echoes lines until the
// client goes or stop is closed.
func echoUpgraded(w http.ResponseWriter, r *http.Request, stop <-chan struct{}) {
	if !strings.EqualFold(r.Header.Get("Connection"), "upgrade") || r.Header.Get("Upgrade") != "echo" {
		http.Error(w, "not an upgrade", http.StatusBadRequest)
		return
	}
	c, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	go func() { <-stop; c.Close() }()
	rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	rw.Flush()
	for {
		line, err := rw.ReadString('\n')
		if err != nil {
			return
		}
		rw.WriteString(line)
		rw.Flush()
	}
}

// openUpgraded opens an upgraded connection through the cell to the
// origin's echo.
func openUpgraded(t *testing.T, port int) *keptConn {
	k := keepConn(t, port)
	k.c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(k.c, "GET /upgrade HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", testHost)
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade through the cell: %v %v", resp, err)
	}
	return k
}

// echo sends a line on an upgraded connection and reads it back.
func (k *keptConn) echo(line string) error {
	k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(k.c, line+"\n"); err != nil {
		return err
	}
	got, err := k.r.ReadString('\n')
	if err == nil && got != line+"\n" {
		err = fmt.Errorf("echoed %q, want %q", got, line)
	}
	return err
}

// dataDomains is testHost with /static answered "v<n>" by the cell and the
// rest proxied to origin, and other.test answering "v<n>" too.
func dataDomains(origin string, n int) []domain.Domain {
	body := "v" + strconv.Itoa(n)
	return []domain.Domain{{
		Domain: testHost, Pool: domain.PoolSharedDefault, Revision: int64(n), Hostnames: []string{testHost},
		Origins: []domain.Origin{{Name: "app", URL: origin}},
		Routes: []domain.Route{
			{Prefix: "/", Origin: "app"},
			{Prefix: "/static", Respond: &domain.Response{Status: 200, Body: body}},
		},
	}, {
		Domain: "other.test", Pool: domain.PoolSharedDefault, Revision: int64(n), Hostnames: []string{"other.test"},
		Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: body}}},
	}}
}

// publish activates release seq of ds for cell-01 (edit applied to its
// render inputs) and has the cell take it, as the activation does; it
// returns how.
func (h *harness) publish(seq int64, ds []domain.Domain, edit func(*runtime.RenderParams)) string {
	h.t.Helper()
	h.activateWith(seq, ds, edit)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	how, err := h.sup.Apply(ctx, "cell-01")
	if err != nil {
		h.t.Fatalf("apply %d: %v", seq, err)
	}
	return how
}

// activate builds, installs and switches release seq of ds for cell-01.
func (h *harness) activate(seq int64, ds []domain.Domain) { h.activateWith(seq, ds, nil) }

func (h *harness) activateWith(seq int64, ds []domain.Domain, edit func(*runtime.RenderParams)) {
	h.t.Helper()
	s := h.slotSpec("cell-01")
	pools, err := runtime.CompilePools(ds)
	if err != nil {
		h.t.Fatal(err)
	}
	p := agent.RenderParams(h.cfg, s, domain.PoolSharedDefault, seq)
	if edit != nil {
		edit(&p)
	}
	if pools[domain.PoolSharedDefault] != nil {
		pools[domain.PoolSharedDefault].Keys = h.keys
	}
	r, err := runtime.BuildRelease(p, pools[domain.PoolSharedDefault])
	if err != nil {
		h.t.Fatal(err)
	}
	if _, _, err := runtime.Activate(s, r); err != nil {
		h.t.Fatal(err)
	}
}

// getHost is get with another Host.
func getHost(port int, host, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Host = host
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// keptConn is a client's keep-alive connection to a cell.
type keptConn struct {
	c net.Conn
	r *bufio.Reader
}

// ask sends one request on the connection and reads its answer.
func (k *keptConn) ask(path string) (string, error) {
	k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(k.c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, testHost); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func keepConn(t *testing.T, port int) *keptConn {
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &keptConn{c: c, r: bufio.NewReader(c)}
}

// openStream starts a streamed response through the cell and returns its
// lines as they come (closed when it ends).
func openStream(t *testing.T, port int) <-chan string {
	c := keepConn(t, port)
	if _, err := fmt.Fprintf(c.c, "GET /stream HTTP/1.1\r\nHost: %s\r\n\r\n", testHost); err != nil {
		t.Fatal(err)
	}
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.c.SetReadDeadline(time.Time{})
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return lines
}

// awaitLine waits for the stream's next line; false when it ended.
func awaitLine(t *testing.T, lines <-chan string) bool {
	t.Helper()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return false
			}
			if strings.HasPrefix(l, "line ") {
				return true
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the stream sent nothing for 10s")
		}
	}
}

// drainLines takes what the stream sent so far; false when it ended.
func drainLines(lines <-chan string) bool {
	for {
		select {
		case _, ok := <-lines:
			if !ok {
				return false
			}
		default:
			return true
		}
	}
}

func cellStatus(t testing.TB, api *cellapi.Client) cellapi.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := api.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A streamed response, an upgraded connection (a WebSocket's, to the
// cell) and 50 idle keep-alive connections are held through data publishes: none is cut, the worker stays the same, and each publish
// is served as soon as Apply returns.
func TestDataPublishesLoadWithoutReload(t *testing.T) {
	origin := streamOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: dataDomains(origin.URL, 1)})
	port := h.waitReady("cell-01", 0).HTTPPort
	api := privateClient(t, h, "cell-01", nil)
	before := cellStatus(t, api)

	stream := openStream(t, port)
	awaitLine(t, stream)
	upgraded := openUpgraded(t, port)
	if err := upgraded.echo("before"); err != nil {
		t.Fatal(err)
	}
	idle := make([]*keptConn, 50)
	for i := range idle {
		idle[i] = keepConn(t, port)
		if body, err := idle[i].ask("/static"); err != nil || body != "v1" {
			t.Fatalf("keep-alive connection %d: %q, %v", i, body, err)
		}
	}

	publishes := 100
	if testing.Short() {
		publishes = 25
	}
	last := publishes + 1
	var more []<-chan string
	for n := 2; n <= last; n++ {
		if how := h.publish(int64(n), dataDomains(origin.URL, n), nil); how != "loaded" {
			t.Fatalf("publish %d: %s, want loaded", n, how)
		}
		if code, body, err := get(port, "/static"); err != nil || code != 200 || body != "v"+strconv.Itoa(n) {
			t.Fatalf("after publish %d returned: %d %q %v, want v%d", n, code, body, err, n)
		}
		if !drainLines(stream) {
			t.Fatalf("the stream was cut at publish %d", n)
		}
		if n%10 == 0 {
			if err := upgraded.echo("after " + strconv.Itoa(n)); err != nil {
				t.Fatalf("the upgraded connection after publish %d: %v", n, err)
			}
			more = append(more, openStream(t, port)) // one more held across what follows
		}
	}
	for i, s := range append(more, stream) {
		if !awaitLine(t, s) {
			t.Fatalf("stream %d was cut", i)
		}
	}
	want := "v" + strconv.Itoa(last)
	for i, k := range idle {
		if body, err := k.ask("/static"); err != nil || body != want {
			t.Errorf("keep-alive connection %d after the publishes: %q, %v; want %s", i, body, err, want)
		}
	}
	after := cellStatus(t, api)
	if after.WorkerPID != before.WorkerPID || after.WorkerPID == 0 {
		t.Errorf("worker %d before, %d after: a new worker generation", before.WorkerPID, after.WorkerPID)
	}
	if after.Sequence != int64(last) || after.ConfRelease != before.ConfRelease || after.Loads.Count != int64(publishes) {
		t.Errorf("cell serves %d (configuration of %s, was %s), %d loads; want %d, the same configuration, %d loads",
			after.Sequence, after.ConfRelease, before.ConfRelease, after.Loads.Count, last, publishes)
	}
	if after.Cut.Shutdown != 0 {
		t.Errorf("%d requests cut", after.Cut.Shutdown)
	}
	if a := h.slot("cell-01").Applied; a == nil || a.How != "loaded" || a.Sequence != int64(last) {
		t.Errorf("status says the last release was applied %+v", a)
	}
}

// Two domains changed in one publish switch together: a client
// alternating between them never sees one new and the other old.
func TestDataPublishSwitchesDomainsTogether(t *testing.T) {
	origin := streamOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: dataDomains(origin.URL, 1)})
	port := h.waitReady("cell-01", 0).HTTPPort
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		seen   []int
		latest atomic.Int64
		errs   atomic.Int64
		wg     sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			code, body, err := getHost(port, []string{testHost, "other.test"}[i%2], []string{"/static", "/"}[i%2])
			if err != nil || code != 200 {
				errs.Add(1)
				continue
			}
			v, _ := strconv.Atoi(strings.TrimPrefix(body, "v"))
			seen = append(seen, v)
			latest.Store(int64(v))
		}
	}()
	for n := 2; n <= 31; n++ {
		if how := h.publish(int64(n), dataDomains(origin.URL, n), nil); how != "loaded" {
			t.Fatalf("publish %d: %s", n, how)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if v := latest.Load(); v != 31 {
			return fmt.Errorf("the client saw v%d last", v)
		}
		return nil
	})
	cancel()
	wg.Wait()
	if errs.Load() != 0 {
		t.Errorf("%d requests failed", errs.Load())
	}
	// One state at a time, swapped whole: what the client sees never goes
	// back, whichever domain it asks.
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			t.Fatalf("request %d saw v%d after request %d saw v%d: the domains did not switch together", i, seen[i], i-1, seen[i-1])
		}
	}
	if len(seen) < 10 || seen[len(seen)-1] != 31 {
		t.Errorf("saw %d answers, the last v%d; want many, ending with v31", len(seen), seen[len(seen)-1])
	}
}

// A release the cell cannot load (its data does not decode) leaves the
// cell serving what it had, says why, and the reload the agent falls back
// to fails the same way without taking the cell out of service.
func TestFailedLoadKeepsServing(t *testing.T) {
	origin := streamOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: dataDomains(origin.URL, 1)})
	port := h.waitReady("cell-01", 0).HTTPPort
	api := privateClient(t, h, "cell-01", nil)

	s := h.slotSpec("cell-01")
	pools, err := runtime.CompilePools(dataDomains(origin.URL, 2))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.BuildRelease(agent.RenderParams(h.cfg, s, domain.PoolSharedDefault, 2), pools[domain.PoolSharedDefault])
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runtime.Activate(s, r); err != nil {
		t.Fatal(err)
	}
	// Damaged after the agent wrote it: the cell finds it does not decode.
	data := filepath.Join(s.RuntimeDir(), "current", "pools", domain.PoolSharedDefault+".json")
	if err := os.WriteFile(data, []byte(`{"pool": "shared-default", "hosts": `), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	how, err := h.sup.Apply(ctx, "cell-01")
	if err != nil || !strings.HasPrefix(how, "reloaded: the cell did not load it") || !strings.Contains(how, "does not decode") {
		t.Errorf("apply: %q, %v; want a reload after the cell's refusal, saying why", how, err)
	}
	st := cellStatus(t, api)
	if st.Sequence != 1 || st.Loads.Failures != 1 || !strings.Contains(st.Loads.LastError, "does not decode") {
		t.Errorf("cell serves %d after the failed load, %d failures (%q); want 1, 1, the reason", st.Sequence, st.Loads.Failures, st.Loads.LastError)
	}
	for i := 0; i < 20; i++ {
		if code, body, err := get(port, "/static"); err != nil || code != 200 || body != "v1" {
			t.Fatalf("after the failed load: %d %q %v, want v1", code, body, err)
		}
	}
	if seq, _, _ := h.sup.Loaded(ctx, "cell-01"); seq == 2 {
		t.Error("Loaded reports the release the cell could not load")
	}
	if got := h.slot("cell-01"); got.State != "ready" {
		t.Errorf("cell is %s (%s), want ready on what it had", got.State, got.Reason)
	}
}

// A release that changes the configuration (here the pool's limits) is
// reloaded gracefully: a new worker, and no client request fails.
func TestShapeChangeReloadsGracefully(t *testing.T) {
	origin := streamOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: dataDomains(origin.URL, 1)})
	port := h.waitReady("cell-01", 0).HTTPPort
	api := privateClient(t, h, "cell-01", nil)
	before := cellStatus(t, api)
	stop := loadOn(t, "/static", "", port, port, port, port)
	how := h.publish(2, dataDomains(origin.URL, 2), func(p *runtime.RenderParams) {
		p.Limits = runtime.PoolLimits{MaxConns: 500}
	})
	if how != "reloaded: configuration changed" {
		t.Errorf("apply: %q, want a reload for the changed configuration", how)
	}
	h.awaitLoaded(2, 30*time.Second)
	if sent, failed, first := stop(); failed != 0 || sent == 0 {
		t.Errorf("%d of %d requests failed across the reload (first: %s)", failed, sent, first)
	}
	if after := cellStatus(t, api); after.WorkerPID == before.WorkerPID || after.Limits.MaxConns != 500 {
		t.Errorf("worker %d → %d, limits %+v: want a new worker with the new limits", before.WorkerPID, after.WorkerPID, after.Limits)
	}
}

// shuttingDownWorkers counts the cell's workers finishing after a reload.
func shuttingDownWorkers(t *testing.T, h *harness) int {
	n := 0
	for _, pid := range nginxProcs(t, h, "cell-01") {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if strings.Contains(string(b), "is shutting down") {
			n++
		}
	}
	return n
}

// A burst of publishes that each need a reload, with a stream held open
// across each (so every old generation lingers for its shutdown timeout),
// never leaves more than two old generations, keeps the cell in service,
// and ends on the last release.
func TestReloadBurstDoesNotPileUpWorkers(t *testing.T) {
	origin := streamOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: dataDomains(origin.URL, 1),
		liveness: supervisor.LivenessPolicy{Interval: 200 * time.Millisecond}})
	port := h.waitReady("cell-01", 0).HTTPPort
	h.cfg.OpenResty.WorkerShutdownTimeout = config.Duration(3 * time.Second) // each generation lingers for it
	stop := loadOn(t, "/static", "", port)
	ctx, cancel := context.WithCancel(context.Background())
	var most atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if n := int64(shuttingDownWorkers(t, h)); n > most.Load() {
				most.Store(n)
			}
			time.Sleep(10 * time.Millisecond) // a sampling interval, not a synchronisation
		}
	}()
	const last = 11
	for n := 2; n <= last; n++ {
		openStream(t, port) // held: its worker lingers after the reload
		h.publish(int64(n), dataDomains(origin.URL, n), func(p *runtime.RenderParams) {
			p.Limits = runtime.PoolLimits{MaxConns: 1000 + n}
		})
	}
	h.awaitLoaded(last, 60*time.Second)
	cancel()
	wg.Wait()
	if most.Load() > 2 {
		t.Errorf("%d old worker generations at once, want at most 2", most.Load())
	}
	if sent, failed, first := stop(); failed != 0 || sent == 0 {
		t.Errorf("%d of %d requests failed (first: %s)", failed, sent, first)
	}
	if code, body, err := get(port, "/static"); err != nil || code != 200 || body != "v"+strconv.Itoa(last) {
		t.Errorf("after the burst: %d %q %v", code, body, err)
	}
}

// A domain's cache TTL is data: a publish that changes it loads (no new
// worker), and the cell serves an answer from its cache for the new TTL
// from when it was stored, then fetches it again.
func TestCacheTTLIsData(t *testing.T) {
	var hits atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "answer %d", hits.Add(1))
	}))
	t.Cleanup(origin.Close)
	cached := func(rev int64, ttl int) []domain.Domain {
		ds := originDomain(origin.URL)
		ds[0].Revision, ds[0].Cache = rev, &domain.Cache{TTLSeconds: ttl}
		return ds
	}
	h := newHarness(t, harnessOpts{slots: 1, domains: cached(1, 3600)})
	port := h.waitReady("cell-01", 0).HTTPPort
	api := privateClient(t, h, "cell-01", nil)
	before := cellStatus(t, api)
	body := func() string {
		t.Helper()
		code, b, err := get(port, "/page")
		if err != nil || code != 200 {
			t.Fatalf("GET /page: %d %v", code, err)
		}
		return b
	}
	first := body()
	if again := body(); again != first {
		t.Fatalf("not cached for the hour's TTL: %q then %q", first, again)
	}
	if how := h.publish(2, cached(2, 1), nil); how != "loaded" {
		t.Fatalf("a TTL change: %s, want loaded", how)
	}
	// Stored over a second ago by the time the TTL is 1 s: fetched again,
	// and the fresh answer is then served from the cache.
	var fresh string
	testutil.Eventually(t, 10*time.Second, func() error {
		if fresh = body(); fresh == first {
			return fmt.Errorf("still %q", fresh)
		}
		return nil
	})
	if again := body(); again != fresh {
		t.Errorf("the fresh answer was not cached: %q then %q", fresh, again)
	}
	after := cellStatus(t, api)
	if after.WorkerPID != before.WorkerPID {
		t.Errorf("a new worker for a TTL change: %d → %d", before.WorkerPID, after.WorkerPID)
	}
	if after.Cache.Expired == 0 || after.Cache.Hit < 2 {
		t.Errorf("cache counters %+v: want the refetch counted as expired and the hits", after.Cache)
	}
}

// An agent killed between a release's switch and the cell's load: the
// next agent adopts the cell, learns from it that it serves the release
// before, and has it load the switched one, with the same master and
// worker.
func TestAdoptedCellLoadsTheSwitchedRelease(t *testing.T) {
	origin := streamOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: dataDomains(origin.URL, 1)})
	before := h.waitReady("cell-01", 0)
	api := privateClient(t, h, "cell-01", nil)
	worker := cellStatus(t, api).WorkerPID
	h.activate(2, dataDomains(origin.URL, 2)) // switched; the agent is killed before it applies it
	h.leaveAndRestart()
	after := h.waitReady("cell-01", 0)
	if after.PID != before.PID {
		t.Fatalf("master %d → %d: not adopted", before.PID, after.PID)
	}
	st := cellStatus(t, api)
	if st.Sequence != 2 || st.WorkerPID != worker {
		t.Errorf("after the restart the cell serves %d with worker %d (was %d); want 2, the same worker", st.Sequence, st.WorkerPID, worker)
	}
	if code, body, err := get(after.HTTPPort, "/static"); err != nil || code != 200 || body != "v2" {
		t.Errorf("after the restart: %d %q %v, want v2", code, body, err)
	}
}

// awaitLoaded waits until cell-01 has loaded sequence seq (Loaded, as the
// activation asks), within timeout.
func (h *harness) awaitLoaded(seq int64, timeout time.Duration) {
	h.t.Helper()
	testutil.Eventually(h.t, timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if got, _, err := h.sup.Loaded(ctx, "cell-01"); err != nil || got != seq {
			return fmt.Errorf("loaded %d, %v", got, err)
		}
		return nil
	})
}

// A cell refuses to load a release older than the one it serves, or a
// name that is no release of its own, and keeps serving what it had.
func TestLoadRefusesOlderAndForeignReleases(t *testing.T) {
	origin := streamOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: dataDomains(origin.URL, 1)})
	h.waitReady("cell-01", 0)
	api := privateClient(t, h, "cell-01", nil)
	first := cellStatus(t, api).Release
	if how := h.publish(2, dataDomains(origin.URL, 2), nil); how != "loaded" {
		t.Fatalf("publish 2: %s", how)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var r *cellapi.Refusal
	if _, err := api.Load(ctx, first); !errors.As(err, &r) || r.Kind != cellapi.RefusedOlder {
		t.Errorf("load of the older release %s: %v, want refused as older", first, err)
	}
	if _, err := api.Load(ctx, "999999999999-00000000000000"); !errors.As(err, &r) || r.Kind != cellapi.RefusedFailed {
		t.Errorf("load of a release the cell does not have: %v, want refused as failed", err)
	}
	if _, err := api.Load(ctx, "../../etc"); err == nil {
		t.Error("a name that is no release's was sent")
	}
	if st := cellStatus(t, api); st.Sequence != 2 {
		t.Errorf("after the refusals the cell serves %d, want 2", st.Sequence)
	}
}
