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
	"testing"
	"time"

	"cellvisor/cellapi"
	"cellvisor/domain"
	"cellvisor/logbound"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// originDomain is testHost proxied to origin, with /static answered by the cell.
func originDomain(origin string) []domain.Domain {
	return []domain.Domain{{
		Domain: testHost, Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{testHost},
		Origins: []domain.Origin{{Name: "app", URL: origin}},
		Routes: []domain.Route{
			{Prefix: "/", Origin: "app"},
			{Prefix: "/static", Respond: &domain.Response{Status: 200, Body: "static"}},
		},
	}}
}

// gateOrigin is a loopback origin whose requests wait until released.
type gateOrigin struct {
	*httptest.Server
	entered chan string
	release chan struct{}
}

func newGateOrigin(t *testing.T) *gateOrigin {
	g := &gateOrigin{entered: make(chan string, 1024), release: make(chan struct{})}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.entered <- r.Header.Get("X-Req")
		select {
		case <-g.release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "from origin "+r.Header.Get("X-Req"))
	}))
	t.Cleanup(func() {
		select {
		case <-g.release:
		default:
			close(g.release)
		}
		g.Close()
	})
	return g
}

func readiness(t *testing.T, port int) int {
	t.Helper()
	code, _, err := get(port, "/.cellvisor/ready")
	if err != nil {
		t.Fatalf("readiness: %v", err)
	}
	return code
}

func privateClient(t testing.TB, h *harness, name string, secret []byte) *cellapi.Client {
	t.Helper()
	s := h.slotSpec(name)
	if secret == nil {
		var err error
		if secret, err = s.Secret(); err != nil {
			t.Fatal(err)
		}
	}
	c := cellapi.New(s.PrivateSocket(), secret)
	t.Cleanup(c.Close)
	return c
}

// Unauthenticated, wrong-secret, stale and replayed calls to every handler
// get 401, change nothing, and are reported as security events.
func TestPrivateEndpointRefusesBadCalls(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, monitor: 50 * time.Millisecond})
	h.waitReady("cell-01", 0)
	good := privateClient(t, h, "cell-01", nil)
	wrong := privateClient(t, h, "cell-01", []byte(strings.Repeat("0", 64)))
	ctx := context.Background()
	port := h.slot("cell-01").HTTPPort
	refused := 0
	for _, call := range []struct{ method, path string }{{"GET", "/status"}, {"POST", "/drain"}, {"POST", "/undrain"}} {
		replay := good.Headers(call.method, call.path, time.Now())
		if _, err := good.Do(ctx, call.method, call.path, replay); err != nil && call.path != "/undrain" {
			t.Fatalf("the first use of fresh credentials for %s %s: %v", call.method, call.path, err)
		}
		if call.path == "/drain" { // put it back: the refusals below must find it undrained
			if _, err := good.Undrain(ctx); err != nil {
				t.Fatal(err)
			}
		}
		bad := map[string]http.Header{
			"no credentials":      {},
			"wrong secret":        wrong.Headers(call.method, call.path, time.Now()),
			"stale, wrong secret": wrong.Headers(call.method, call.path, time.Now().Add(-5*time.Minute)),
			"replayed":            replay,
			"other path":          good.Headers(call.method, "/status-other", time.Now()),
		}
		for name, hdr := range bad {
			_, err := good.Do(ctx, call.method, call.path, hdr)
			if !errors.Is(err, cellapi.ErrUnauthorized) {
				t.Errorf("%s %s with %s: %v, want 401", call.method, call.path, name, err)
			}
			refused++
		}
		if code := readiness(t, port); code != 200 {
			t.Errorf("after refused %s calls readiness is %d: a refused call changed the cell", call.path, code)
		}
	}
	// Correctly signed but late, past its deadline (a call queued while
	// the cell was stalled, its caller gone): not done, and not a security
	// event.
	staleDeadline := good.Headers("POST", "/drain", time.Now().Add(-5*time.Minute))
	staleDeadline.Set(cellapi.HeaderDeadline, strconv.FormatInt(time.Now().Add(-5*time.Minute+5*time.Second).UnixMilli(), 10))
	pastDeadline := good.Headers("POST", "/drain", time.Now())
	pastDeadline.Set(cellapi.HeaderDeadline, strconv.FormatInt(time.Now().Add(-time.Second).UnixMilli(), 10))
	for name, hdr := range map[string]http.Header{"stale, past its deadline": staleDeadline, "past its deadline": pastDeadline} {
		if _, err := good.Do(ctx, "POST", "/drain", hdr); !errors.Is(err, cellapi.ErrExpired) {
			t.Errorf("drain %s: %v, want expired", name, err)
		}
		if code := readiness(t, port); code != 200 {
			t.Errorf("after a drain %s readiness is %d: a late call was carried out", name, code)
		}
	}
	// Correctly signed, outside the window, and no deadline passed (none,
	// or one moved ahead: the deadline is not signed): a replay of a
	// captured proof, not the agent's own call. Refused and counted.
	staleNoDeadline := good.Headers("POST", "/drain", time.Now().Add(-5*time.Minute))
	staleMoved := good.Headers("POST", "/drain", time.Now().Add(-5*time.Minute))
	staleMoved.Set(cellapi.HeaderDeadline, strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10))
	for name, hdr := range map[string]http.Header{"stale, no deadline": staleNoDeadline, "stale, deadline moved ahead": staleMoved} {
		if _, err := good.Do(ctx, "POST", "/drain", hdr); !errors.Is(err, cellapi.ErrUnauthorized) {
			t.Errorf("drain %s: %v, want 401", name, err)
		}
		refused++
		if code := readiness(t, port); code != 200 {
			t.Errorf("after a drain %s readiness is %d: a stale call was carried out", name, code)
		}
	}
	st, err := good.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Drained || st.Security.AuthFailures != int64(refused) || st.Security.Expired != 2 {
		t.Errorf("cell status %+v: want undrained with %d refused calls and 2 expired", st, refused)
	}
	if live := h.sup.LiveStatus(ctx).Slots[0]; live.Cell == nil || live.Cell.Security.AuthFailures != int64(refused) {
		t.Errorf("agent status cell report %+v (%s): want %d security events", live.Cell, live.CellError, refused)
	}
}

// Drain with a slow request in flight: it completes with 200, readiness
// answers 503 meanwhile, the state is drained (and survives an agent
// restart), and undrain restores ready.
func TestDrainWithRequestInFlight(t *testing.T) {
	origin := newGateOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: originDomain(origin.URL)})
	port := h.waitReady("cell-01", 0).HTTPPort

	// An idle keep-alive connection opened before the drain.
	idle, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprintf(idle, "GET /static HTTP/1.1\r\nHost: %s\r\n\r\n", testHost)
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("keep-alive request: %v", err)
	}
	io.Copy(io.Discard, resp.Body)

	type result struct {
		code int
		body string
		err  error
	}
	inflight := make(chan result, 1)
	go func() {
		code, body, err := getWith(port, "/slow", "slow-1")
		inflight <- result{code, body, err}
	}()
	<-origin.entered // the request is in flight at the origin

	st, err := h.sup.Drain(context.Background(), "cell-01")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != supervisor.StateDrained {
		t.Errorf("state %s after drain, want drained", st.State)
	}
	if code := readiness(t, port); code != 503 {
		t.Errorf("readiness %d while drained, want 503", code)
	}
	// The idle keep-alive connection is closed by the cell.
	idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("idle keep-alive connection after drain: %v, want closed (EOF)", err)
	}
	close(origin.release)
	r := <-inflight
	if r.err != nil || r.code != 200 || r.body != "from origin slow-1" {
		t.Fatalf("request in flight during the drain: %d %q %v, want 200 from the origin", r.code, r.body, r.err)
	}
	if !h.slotSpec("cell-01").Drained() {
		t.Error("drained state not persisted")
	}

	h.restart()
	if st := h.waitState("cell-01", supervisor.StateDrained); !st.Drained {
		t.Errorf("after an agent restart: %+v, want drained", st)
	}
	if code := readiness(t, h.slot("cell-01").HTTPPort); code != 503 {
		t.Errorf("readiness %d after an agent restart of a drained cell, want 503", code)
	}

	st, err = h.sup.Undrain(context.Background(), "cell-01")
	if err != nil || st.State != supervisor.StateReady {
		t.Fatalf("undrain: %s %v", st.State, err)
	}
	if code := readiness(t, port); code != 200 {
		t.Errorf("readiness %d after undrain, want 200", code)
	}
	if h.slotSpec("cell-01").Drained() {
		t.Error("undrained state not persisted")
	}
}

func (h *harness) waitState(name string, want supervisor.State) supervisor.SlotStatus {
	var st supervisor.SlotStatus
	testutil.Eventually(h.t, 30*time.Second, func() error {
		if st = h.slot(name); st.State != want {
			return fmt.Errorf("%s is %s (%s), want %s", name, st.State, st.Reason, want)
		}
		return nil
	})
	return st
}

// Restart under a steady stream of requests: every request the cell had
// accepted (the origin saw it) before the restart began completes with 200;
// the rate limit refuses the fourth restart.
func TestRestartUnderSteadyStreamAndRateLimit(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]time.Time{}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("X-Req")] = time.Now()
		mu.Unlock()
		time.Sleep(50 * time.Millisecond) // a slow origin: requests are in flight
		io.WriteString(w, "ok")
	}))
	defer origin.Close()
	h := newHarness(t, harnessOpts{slots: 1, domains: originDomain(origin.URL), drain: 2 * time.Second})
	port := h.waitReady("cell-01", 0).HTTPPort

	type result struct {
		code int
		err  error
	}
	var rmu sync.Mutex
	results := map[string]result{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tag := fmt.Sprintf("w%d-%d", w, i)
				code, _, err := getWith(port, "/stream", tag)
				rmu.Lock()
				results[tag] = result{code, err}
				rmu.Unlock()
				if err != nil {
					time.Sleep(5 * time.Millisecond) // the cell is restarting: do not spin
				}
			}
		}()
	}
	// Let the stream run, then restart three times under it.
	testutil.Eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) < 20 {
			return fmt.Errorf("%d requests so far", len(seen))
		}
		return nil
	})
	var began []time.Time
	for i := 0; i < 3; i++ {
		before := h.slot("cell-01").PID
		began = append(began, time.Now())
		st, err := h.sup.Restart(context.Background(), "cell-01")
		if err != nil {
			t.Fatalf("restart %d: %v", i+1, err)
		}
		if st.PID == before || st.State != supervisor.StateReady {
			t.Fatalf("restart %d: pid %d → %d, state %s", i+1, before, st.PID, st.State)
		}
	}
	pid := h.slot("cell-01").PID
	if _, err := h.sup.Restart(context.Background(), "cell-01"); !errors.Is(err, supervisor.ErrRateLimited) {
		t.Errorf("fourth restart: %v, want ErrRateLimited", err)
	} else if !strings.Contains(err.Error(), "next is allowed in") {
		t.Errorf("refusal %q does not say when the next restart is allowed", err)
	}
	if st := h.slot("cell-01"); st.PID != pid || st.OperatorRestarts != 3 || st.Restarts != 0 {
		t.Errorf("pid %d (was %d), %d operator restarts, %d crash restarts: want the same pid, 3 and 0 (a refused restart restarts nothing and counts nothing)",
			st.PID, pid, st.OperatorRestarts, st.Restarts)
	}
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	accepted := 0
	for tag, at := range seen {
		for _, b := range began {
			// Accepted before a restart began, and in flight then (the origin
			// takes 50ms): it must have completed.
			if at.Before(b) && at.Add(100*time.Millisecond).After(b) {
				accepted++
				if r := results[tag]; r.err != nil || r.code != 200 {
					t.Errorf("request %s, in flight when a restart began, got %d %v", tag, r.code, r.err)
				}
			}
		}
	}
	if accepted == 0 {
		t.Fatal("no request was in flight when a restart began: the test proved nothing")
	}
	t.Logf("%d requests in flight at a restart all completed; %d requests in all", accepted, len(seen))
}

// A cell whose origin is down reports the failures in its passive-origin
// summary.
func TestOriginDownIsReported(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	h := newHarness(t, harnessOpts{slots: 1, domains: originDomain(dead)})
	port := h.waitReady("cell-01", 0).HTTPPort
	for i := 0; i < 3; i++ {
		if code, _, err := get(port, "/x"); err != nil || code != 502 {
			t.Fatalf("request to a dead origin: %d %v, want 502", code, err)
		}
	}
	st, err := privateClient(t, h, "cell-01", nil).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	o, ok := st.Origins[testHost+"/app"]
	if !ok || o.Failures != 3 || o.LastStatus != 502 || o.LastFailureAt == 0 || o.Reasons["connect_failed"] != 3 || o.LastReason != "connect_failed" {
		t.Fatalf("origins %+v: want 3 failures of %s/app, connect_failed, last 502", st.Origins, testHost)
	}
	if st.Requests != 3 {
		t.Errorf("requests %d, want 3 (readiness probes are not requests)", st.Requests)
	}
}

// Writing 40 MiB of log lines through a cell leaves its logs directory at or
// under 16 MiB.
func TestLogsStayWithinBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 40 MiB of logs; skipped in -short mode")
	}
	h := newHarness(t, harnessOpts{slots: 1})
	port := h.waitReady("cell-01", 0).HTTPPort
	logs := h.slotSpec("cell-01").LogsDir()
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	long := strings.Repeat("x", 4000) // ~4 KiB access log lines
	var written, peak int64
	for written < 40<<20 {
		req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+"/?q="+long, nil)
		req.Host = testHost
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		written += int64(len(long) + 200)
		if written%(1<<20) < 4200 {
			if n, _ := logbound.Size(logs); n > peak {
				peak = n
			}
		}
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		n, err := logbound.Size(logs)
		if err != nil {
			return err
		}
		if n > 16<<20 {
			return fmt.Errorf("logs hold %d bytes, budget %d", n, 16<<20)
		}
		return nil
	})
	n, _ := logbound.Size(logs)
	t.Logf("wrote ~%d MiB of log lines; logs dir now %.1f MiB, peak seen %.1f MiB", written>>20, float64(n)/(1<<20), float64(peak)/(1<<20))
	if code, _, err := get(port, "/"); err != nil || code != 200 {
		t.Errorf("cell after rotations: %d %v", code, err)
	}
}

// Request bodies over 64 MiB are refused with 413 and leave nothing in the
// cell's tmp/request.
func TestBodyOverLimitRefused(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%d", n)
	}))
	defer origin.Close()
	h := newHarness(t, harnessOpts{slots: 1, domains: originDomain(origin.URL)})
	port := h.waitReady("cell-01", 0).HTTPPort
	tmp := h.slotSpec("cell-01").RequestTmpDir()
	hc := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 5 * time.Second, DisableKeepAlives: true}}
	post := func(size int64, chunked bool) (int, string, error) {
		var body io.Reader = io.LimitReader(zeros{}, size)
		req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:"+strconv.Itoa(port)+"/upload", body)
		req.Host = testHost
		if chunked {
			req.ContentLength = -1
		} else {
			req.ContentLength = size
			req.Header.Set("Expect", "100-continue")
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if code, body, err := post(1<<20, false); err != nil || code != 200 || body != strconv.Itoa(1<<20) {
		t.Fatalf("1 MiB body: %d %q %v, want the origin to get it all", code, body, err)
	}
	if code, _, err := post(65<<20, false); err != nil || code != 413 {
		t.Errorf("65 MiB body with Content-Length: %d %v, want 413", code, err)
	}
	// A chunked body reserves the whole per-request limit, here the cell's
	// whole body budget (limits.request_tmp): it is admitted once the
	// bodies before it are given back, which a lingering close of their
	// connections may delay a moment.
	testutil.Eventually(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if cs := h.sup.LiveStatus(ctx).Slots[0].Cell; cs == nil || cs.Bodies.Held != 0 {
			return fmt.Errorf("cell status %+v, want no body held", cs)
		}
		return nil
	})
	if code, _, err := post(65<<20, true); err != nil || code != 413 {
		t.Errorf("65 MiB chunked body: %d %v, want 413", code, err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		var left []string
		err := walkFiles(tmp, func(p string) { left = append(left, p) })
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("left in tmp/request: %v", left)
		}
		return nil
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func walkFiles(dir string, fn func(string)) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := dir + "/" + e.Name()
		if e.IsDir() {
			if err := walkFiles(p, fn); err != nil {
				return err
			}
			continue
		}
		fn(p)
	}
	return nil
}

// Drains and undrains back to back: each reload closes the old workers'
// connections, and no call may trip over one (a POST is not retried).
func TestRepeatedDrainUndrain(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1})
	port := h.waitReady("cell-01", 0).HTTPPort
	for i := 0; i < 5; i++ {
		if _, err := h.sup.Drain(context.Background(), "cell-01"); err != nil {
			t.Fatalf("drain %d: %v", i+1, err)
		}
		if code := readiness(t, port); code != 503 {
			t.Fatalf("drain %d: readiness %d", i+1, code)
		}
		if _, err := h.sup.Undrain(context.Background(), "cell-01"); err != nil {
			t.Fatalf("undrain %d: %v", i+1, err)
		}
		if code := readiness(t, port); code != 200 {
			t.Fatalf("undrain %d: readiness %d", i+1, code)
		}
	}
}

// An operator restart whose new master exits before it is ready is answered
// with that exit: the binary (a wrapper around the host's nginx) runs nginx
// once, and fails every later start.
func TestRestartThatNeverGetsReadyIsAnError(t *testing.T) {
	nginx, _ := testutil.RequireOpenResty(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "started")
	bin := filepath.Join(dir, "nginx-once")
	// The agent's own -v (its version) and -t (a new binary's check) are
	// not starts.
	script := fmt.Sprintf("#!/bin/sh\ncase \"$1\" in -v|-t) exec %[2]s \"$@\";; esac\nif [ -e %[1]s ]; then echo 'nginx-once: not again' >&2; exit 1; fi\n: > %[1]s\nexec %[2]s \"$@\"\n", marker, nginx)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, harnessOpts{slots: 1, binary: bin})
	h.waitReady("cell-01", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := h.sup.Restart(ctx, "cell-01")
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("restart into a failing binary: %v, want the exit before ready", err)
	}
}
