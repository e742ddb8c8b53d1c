package supervisor_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/testkit/testutil"
)

// Origin failures are the origin's: a refused connection, a connection
// closed without an answer, an invalid answer and the origin's own 5xx are
// counted, each with its reason; a client's aborted upload or abandoned
// request and a body over the limit are not. Before, log() counted every
// proxied request without an upstream status (the 413 of a chunked body,
// an upload the client cut short) against the origin, and gave only a
// status code (issue 39).
func TestOriginFailuresAreTheOrigins(t *testing.T) {
	entered := make(chan struct{}, 16)
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/5xx":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/reset", "/garbage":
			c, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			if r.URL.Path == "/garbage" {
				buf.WriteString("HTTP/1.1 200 OK\r\nX-Bad: a\x00b\r\n\r\n") // a NUL in a header: invalid
				buf.Flush()
			}
			c.Close()
		case "/slow":
			entered <- struct{}{}
			<-r.Context().Done() // until the cell gives up: its client left
		default:
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok")
		}
	}))
	origin.Start()
	t.Cleanup(origin.Close)
	// A loopback port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	doms := originDomain(origin.URL)
	doms[0].Origins = append(doms[0].Origins, domain.Origin{Name: "gone", URL: closed})
	doms[0].Routes = append(doms[0].Routes, domain.Route{Prefix: "/gone", Origin: "gone"})
	h := newHarness(t, harnessOpts{slots: 1, domains: doms, bodyBudget: 1 << 20})
	port := h.waitReady("cell-01", 0).HTTPPort
	raw := func(req string, closeAfter bool) {
		t.Helper()
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, req)
		if closeAfter {
			return
		}
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		io.Copy(io.Discard, c)
	}
	// The client's doings: none is the origin's failure.
	raw(fmt.Sprintf("POST /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", testHost, 2<<20, make([]byte, 2<<20)), false) // chunked, over the limit: 413
	raw(fmt.Sprintf("POST /up HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\nshort", testHost), true)                                                                         // cut short: 400
	func() {                                                                                                                                                                       // abandoned while the origin thinks: 499
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: %s\r\n\r\n", testHost)
		select {
		case <-entered:
		case <-time.After(20 * time.Second):
			t.Fatal("the slow request did not reach the origin")
		}
		c.Close()
	}()
	// The origin's failures, each with its reason.
	for _, p := range []string{"/5xx", "/reset", "/garbage", "/gone"} {
		raw(fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", p, testHost), false)
	}
	want := map[string]map[string]int64{
		testHost + "/app":  {"http_5xx": 1, "reset": 1, "bad_answer": 1},
		testHost + "/gone": {"connect_failed": 1},
	}
	testutil.Eventually(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cs := h.sup.LiveStatus(ctx).Slots[0].Cell
		if cs == nil {
			return fmt.Errorf("no cell status")
		}
		for name, reasons := range want {
			o := cs.Origins[name]
			var sum int64
			for r, n := range reasons {
				if o.Reasons[r] != n {
					return fmt.Errorf("origin %s: %+v, want reasons %v", name, o, reasons)
				}
				sum += n
			}
			if o.Failures != sum {
				return fmt.Errorf("origin %s: %d failures, want %d (%v): a client's doing was counted", name, o.Failures, sum, reasons)
			}
		}
		return nil
	})
}
