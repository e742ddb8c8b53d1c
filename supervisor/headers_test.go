package supervisor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/runtime"
)

// What the origin learns about the client is what the edge saw: a client's
// own X-Forwarded-*, X-Real-IP and Forwarded are replaced, and headers that
// make common origins rewrite the request (X-Original-URL, X-Rewrite-URL,
// X-HTTP-Method-Override) never reach it. Before, all of them reached the
// origin as the client sent them, and an answer built from
// X-Forwarded-Host: evil.test was cached and served to the next client.
func TestOriginSeesTheEdgesForwardedHeaders(t *testing.T) {
	seen := make(chan http.Header, 1)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case seen <- r.Header.Clone():
		default:
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(origin.Close)
	doms := originDomain(origin.URL)
	trusted := doms[0]
	trusted.Domain, trusted.Hostnames, trusted.TrustForwarded = "trusted.test", []string{"trusted.test"}, true
	h := newHarness(t, harnessOpts{slots: 1, domains: append(doms, trusted)})
	port := h.waitReady("cell-01", 0).HTTPPort
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	send := func(host string) http.Header {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+"/x", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		spoofed := map[string]string{
			"X-Forwarded-For": "203.0.113.9", "X-Real-IP": "203.0.113.9", "X-Forwarded-Host": "evil.test",
			"X-Forwarded-Proto": "https", "Forwarded": "for=203.0.113.9;host=evil.test",
			"X-Original-URL": "/admin", "X-Rewrite-URL": "/admin", "X-HTTP-Method-Override": "DELETE",
		}
		for k, v := range spoofed {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("through the cell: %s", resp.Status)
		}
		select {
		case got := <-seen:
			return got
		case <-ctx.Done():
			t.Fatal("the origin saw no request")
			return nil
		}
	}
	got := send(testHost)
	want := map[string]string{
		"X-Forwarded-For": "127.0.0.1", "X-Real-Ip": "127.0.0.1", "X-Forwarded-Host": testHost, "X-Forwarded-Proto": "http",
		"Forwarded": "", "X-Original-Url": "", "X-Rewrite-Url": "", "X-Http-Method-Override": "",
	}
	for k, v := range want {
		if g := got.Get(k); g != v {
			b, _ := json.Marshal(got)
			t.Errorf("origin saw %s %q, want %q (all: %s)", k, g, v, b)
		}
	}
	// A domain that trusts its clients' forwarding headers (its own
	// proxies) has them passed on: the address appended, the scheme kept.
	got = send("trusted.test")
	if xff, xfp := got.Get("X-Forwarded-For"), got.Get("X-Forwarded-Proto"); xff != "203.0.113.9, 127.0.0.1" || xfp != "https" {
		t.Errorf("trust_forwarded: origin saw X-Forwarded-For %q, X-Forwarded-Proto %q; want the client's with the edge's address appended, https", xff, xfp)
	}
}

// Nothing of the host's topology reaches the public by default: no cell
// name in a header, nor in the answer to an unknown host.
func TestCellNameNotDisclosed(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1})
	port := h.waitReady("cell-01", 0).HTTPPort
	if _, body, err := get(port, "/.cellvisor/ready"); err != nil || body != "ready\n" {
		t.Errorf("the public readiness page: %q, %v; want \"ready\" and nothing of the cell", body, err)
	}
	for _, host := range []string{testHost, "unknown.example"} {
		req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if v := resp.Header.Get("X-Cellvisor-Cell"); v != "" {
			t.Errorf("%s: X-Cellvisor-Cell %q", host, v)
		}
		if strings.Contains(string(body), "cell-") {
			t.Errorf("%s: the answer names the cell: %q", host, body)
		}
		if v, ok := resp.Header["Server"]; ok {
			t.Errorf("%s: Server %q, want none", host, v)
		}
	}
	// nginx's own refusals (an over-long request line, a malformed Host)
	// are the bare status: nothing names nginx.
	for _, tc := range []struct {
		name, path, host string
		code             int
	}{
		{"over-long URI", "/" + strings.Repeat("a", 20000), testHost, http.StatusRequestURITooLong},
		{"bad Host", "/", "a b", http.StatusBadRequest},
	} {
		req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = tc.host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_, server := resp.Header["Server"]
		if resp.StatusCode != tc.code || string(body) != strconv.Itoa(tc.code)+"\n" || server {
			t.Errorf("%s: %d %q (Server header %v), want %d and the bare status, no Server", tc.name, resp.StatusCode, body, server, tc.code)
		}
	}
}

// A client that stops reading a large proxied answer never makes the cell
// write it to disk: past its in-memory buffers the cell stops reading from
// the origin. Before, nginx buffered up to 1 GiB per response in unlinked
// files under the slot's tmp/proxy, counted by no budget.
func TestSlowReaderBuffersNothingOnDisk(t *testing.T) {
	const size = 64 << 20
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		chunk := make([]byte, 64<<10)
		for n := 0; n < size; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(origin.Close)
	h := newHarness(t, harnessOpts{slots: 1, domains: originDomain(origin.URL)})
	st := h.waitReady("cell-01", 0)
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(st.HTTPPort)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetReadBuffer(4096) // a reader that takes almost nothing
	}
	fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: %s\r\n\r\n", testHost)
	buf := make([]byte, 4096)
	if _, err := c.Read(buf); err != nil { // the answer has begun
		t.Fatal(err)
	}
	// The cell has read from the origin what its socket and buffers hold;
	// whatever it would write to disk is written by now, or soon: look
	// while the client still reads nothing, for as long as a buffered
	// response of this size would take to appear.
	tmp := filepath.Join(h.slotSpec("cell-01").TmpDir(), "proxy")
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		for _, pid := range cellProcs(t, h, "cell-01") {
			fds, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
			for _, fd := range fds {
				if l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, tmp) {
					t.Fatalf("the cell buffers a slow reader's answer on disk: %s", l)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A cached route stores no answer that says private or no-store on any
// of its Cache-Control lines (nginx reads only the first), and neither
// reads nor fills the cache for a request with cookies. Before, an answer
// of "Cache-Control: public" then "Cache-Control: private" was cached, and
// so was one personalised from a request's cookie.
func TestCacheKeepsOutPrivateAnswersAndCookies(t *testing.T) {
	var hits atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		if r.URL.Path == "/private" {
			w.Header().Add("Cache-Control", "public, max-age=60")
			w.Header().Add("Cache-Control", "private")
		}
		fmt.Fprintf(w, "answer %d for %s", n, r.Header.Get("Cookie"))
	}))
	t.Cleanup(origin.Close)
	doms := originDomain(origin.URL)
	doms[0].Cache = &domain.Cache{TTLSeconds: 60}
	h := newHarness(t, harnessOpts{slots: 1, domains: doms})
	port := h.waitReady("cell-01", 0).HTTPPort
	fetch := func(path, cookie string) string {
		t.Helper()
		_, body := getCookie(t, port, path, cookie)
		return body
	}
	// The control: a plain answer is cached.
	if a, b := fetch("/public", ""), fetch("/public", ""); a != b {
		t.Fatalf("a cacheable answer was not cached: %q then %q", a, b)
	}
	if a, b := fetch("/private", ""), fetch("/private", ""); a == b {
		t.Errorf("an answer with private on its second Cache-Control line was cached: %q twice", a)
	}
	personal := fetch("/me", "session=alice")
	if other := fetch("/me", ""); other == personal {
		t.Errorf("an answer to a request with a cookie was served to another client: %q", other)
	}
}

// Routes match the path as the origin will read it: an edge rule on
// /admin is not passed by encodings, path parameters, backslashes or extra
// slashes, and the origin receives the normalised path (the query as sent).
// Before, /;/admin, /x/..%5cadmin and /%2561dmin reached the origin.
func TestRoutesMatchTheNormalisedPath(t *testing.T) {
	seen := make(chan string, 16)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.URL.RequestURI()
		io.WriteString(w, "origin")
	}))
	t.Cleanup(origin.Close)
	doms := originDomain(origin.URL)
	doms[0].Routes = append(doms[0].Routes, domain.Route{Prefix: "/admin", Respond: &domain.Response{Status: 403, Body: "blocked"}})
	h := newHarness(t, harnessOpts{slots: 1, domains: doms})
	port := h.waitReady("cell-01", 0).HTTPPort
	raw := func(target string) (int, string) {
		t.Helper()
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", target, testHost)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, target := range []string{"/admin", "/admin/x", "/x/../admin", "//admin", "/%2561dmin", "/;/admin", "/x/..%5cadmin", "/adm%69n/"} {
		if code, body := raw(target); code != 403 || body != "blocked" {
			t.Errorf("%s: %d %q, want the /admin rule's 403", target, code, body)
		}
	}
	if code, _ := raw("/%2525252561dmin"); code != 400 {
		t.Errorf("a path still encoded after three decodings: %d, want 400", code)
	}
	for target, want := range map[string]string{"/a%20b/./c?x=1&y=%2F": "/a%20b/c?x=1&y=%2F", "/p;jsessionid=1/q": "/p/q"} {
		if code, body := raw(target); code != 200 || body != "origin" {
			t.Fatalf("%s: %d %q", target, code, body)
		}
		if got := <-seen; got != want {
			t.Errorf("%s reached the origin as %s, want %s", target, got, want)
		}
	}
}

// A pool's connection limit is shared out: one domain's clients (an attack
// on it from several addresses included) hold at most three quarters of it,
// one address an eighth, and another tenant of the cell is still served.
// Before, the whole limit was one key: slow requests to one domain locked
// every other domain of the cell out with 503.
func TestPoolConnectionLimitIsSharedOut(t *testing.T) {
	origin := newGateOrigin(t)
	doms := originDomain(origin.URL)
	const neighbour = "neighbour.cellvisor.test"
	doms = append(doms, domain.Domain{Domain: neighbour, Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{neighbour},
		Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: "neighbour"}}}})
	limits := runtime.PoolLimits{MaxConns: 16}
	h := newHarness(t, harnessOpts{slots: 1, domains: doms, limits: limits})
	port := h.waitReady("cell-01", 0).HTTPPort
	get := func(from, host string) int {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		tr := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+"/held", nil)
		if err != nil {
			t.Error(err)
			return 0
		}
		req.Host = host
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// 8 addresses, 3 requests each, to one domain: held at its origin.
	codes := make(chan int, 24)
	for i := range 24 {
		go func() { codes <- get(fmt.Sprintf("127.0.0.%d", 2+i%8), testHost) }()
	}
	// The ones over a share are refused at once; the rest are held.
	refused := 0
	for held := 0; held+refused < 24; {
		select {
		case <-origin.entered:
			held++
		case c := <-codes:
			if c != http.StatusServiceUnavailable {
				t.Fatalf("a request over the shares answered %d, want 503", c)
			}
			refused++
		case <-time.After(30 * time.Second):
			t.Fatalf("%d held, %d refused of 24", held, refused)
		}
	}
	if held := 24 - refused; held != limits.HostShare() {
		t.Errorf("%d requests to one domain held, want its share %d", held, limits.HostShare())
	}
	if c := get("127.0.0.20", neighbour); c != 200 {
		t.Errorf("the neighbour domain while another holds its share: %d, want 200", c)
	}
}

// A domain's own choices of how its paths and cookies are read: routes
// matched whatever the case (case_insensitive), the path sent to the
// origin as the client wrote it (raw_path), and cookies that personalise
// nothing cached (cache.ignore_cookies), any other cookie not.
func TestDomainPathAndCookieChoices(t *testing.T) {
	var n atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%d %s", n.Add(1), r.URL.EscapedPath())
	}))
	t.Cleanup(origin.Close)
	doms := originDomain(origin.URL)
	doms[0].CaseInsensitive, doms[0].RawPath = true, true
	doms[0].Routes = append(doms[0].Routes, domain.Route{Prefix: "/admin", Respond: &domain.Response{Status: 403, Body: "blocked"}})
	doms[0].Cache = &domain.Cache{TTLSeconds: 60, IgnoreCookies: []string{"consent", "_ga"}}
	h := newHarness(t, harnessOpts{slots: 1, domains: doms})
	port := h.waitReady("cell-01", 0).HTTPPort
	fetch := func(path, cookie string) (int, string) {
		t.Helper()
		return getCookie(t, port, path, cookie)
	}
	if code, _ := fetch("/ADMIN/x", ""); code != 403 {
		t.Errorf("/ADMIN/x on a case-insensitive domain: %d, want the /admin rule's 403", code)
	}
	if _, body := fetch("/a%2Fb", ""); !strings.HasSuffix(body, " /a%2Fb") {
		t.Errorf("raw path: the origin saw %q, want /a%%2Fb as sent", body)
	}
	a, b := func() string { _, s := fetch("/page", "consent=yes; _ga=1"); return s }(), func() string { _, s := fetch("/page", "consent=no"); return s }()
	if a != b {
		t.Errorf("requests with only ignored cookies: %q then %q, want the second from the cache", a, b)
	}
	if _, c := fetch("/page", "consent=yes; session=alice"); c == a {
		t.Errorf("a request with a session cookie was answered from the cache: %q", c)
	}
}

// getCookie fetches path from a cell's port with the test domain's Host
// and, unless "", cookie.
func getCookie(t *testing.T, port int, path, cookie string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = testHost
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
