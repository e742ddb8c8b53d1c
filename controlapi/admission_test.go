package controlapi_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/store"
	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// do sends one request of an edge's and returns its status code and
// Retry-After (0 for none).
func do(t *testing.T, hc *http.Client, method, url string, body io.Reader) (int, int) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	ra := 0
	if v := resp.Header.Get("Retry-After"); v != "" {
		if ra, err = strconv.Atoi(v); err != nil {
			t.Fatalf("Retry-After %q: want seconds", v)
		}
	}
	return resp.StatusCode, ra
}

// A request class at its limit answers 429 with a Retry-After of 1–5 s,
// counted by class, while the other classes are served; a held poll does
// not count against its class; once the class has room it is served again.
func TestAdmissionPerRequestClass(t *testing.T) {
	for _, kind := range []string{store.SQLite, store.Postgres} {
		t.Run(kind, func(t *testing.T) {
			dsn := filepath.Join(t.TempDir(), "control.db")
			if kind == store.Postgres {
				dsn = testutil.Postgres(t)
			}
			key := make([]byte, 32)
			e := serveWith(t, dsn, key, func(o *controlapi.Options) {
				o.Admission = controlapi.Admission{controlapi.ClassStatus: 1, controlapi.ClassPoll: 1}
			})
			created := e.createEdge(t, "fra-1")
			_, _, dir := e.enroll(t, created.Token)
			hc := e.identityClient(t, dir)
			report, _ := json.Marshal(edgeapi.StatusReport{At: time.Now(), Status: json.RawMessage(`{"version":"t","slots":[]}`)})

			// One status report in work (its body still coming, on a
			// connection of its own) fills the class.
			conn, err := tls.Dial("tcp", strings.TrimPrefix(e.edgeURL, "https://"), hc.Transport.(*http.Transport).TLSClientConfig)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				edgeapi.PathStatus, len(report), report[:1]); err != nil {
				t.Fatal(err)
			}
			var retry int
			testutil.Eventually(t, 10*time.Second, func() error {
				code, ra := do(t, hc, http.MethodPost, e.edgeURL+edgeapi.PathStatus, strings.NewReader(string(report)))
				if code != http.StatusTooManyRequests {
					return fmt.Errorf("a second status report: HTTP %d, want 429 while the first is in work", code)
				}
				retry = ra
				return nil
			})
			if retry < 1 || retry > 5 {
				t.Fatalf("429 with Retry-After %d: want 1–5", retry)
			}

			// A poll held (its class bound is 1) leaves room for another
			// poll; acks are served meanwhile.
			c := e.longPollClient(t, dir, time.Minute)
			ch := holdPoll(t, e, c, 1)
			if code, _ := do(t, hc, http.MethodGet, e.edgeURL+edgeapi.PathManifest+"?after=1", nil); code != http.StatusNoContent {
				t.Fatalf("a poll while another is held: HTTP %d, want 204", code)
			}
			ack, _ := json.Marshal(manifest.Ack{Sequence: 1, Status: manifest.AckApplied, At: time.Now()})
			if code, _ := do(t, hc, http.MethodPost, e.edgeURL+edgeapi.PathAcks, strings.NewReader(string(ack))); code != http.StatusNoContent {
				t.Fatalf("an ack while status is full: HTTP %d, want 204", code)
			}
			e.srv.StopHolds()
			if r := <-ch; r.err != nil && !errors.Is(r.err, manifest.ErrNoChange) {
				t.Fatalf("held poll: %v", r.err)
			}

			// The first report ends: the class has room again.
			if _, err := conn.Write(report[1:]); err != nil {
				t.Fatal(err)
			}
			conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil || resp.StatusCode != http.StatusNoContent {
				t.Fatalf("the slow status report: %v %v, want 204", resp, err)
			}
			resp.Body.Close()
			if code, _ := do(t, hc, http.MethodPost, e.edgeURL+edgeapi.PathStatus, strings.NewReader(string(report))); code != http.StatusNoContent {
				t.Fatalf("a status report once the class has room: HTTP %d, want 204", code)
			}
			fams, err := e.srv.Metrics().Registry().Gather()
			if err != nil {
				t.Fatal(err)
			}
			if n := counter(fams, "cellvisor_control_edge_requests_refused_total", map[string]string{"class": "status", "reason": "class_full"}); n < 1 {
				t.Fatalf("refused status requests counted %v, want at least 1", n)
			}
			if n := counter(fams, "cellvisor_control_edge_requests_refused_total", map[string]string{"class": "ack"}); n != 0 {
				t.Fatalf("refused acks counted %v, want 0", n)
			}
		})
	}
}

// Limits out of their bounds or of an unknown class are refused naming
// the rule.
func TestAdmissionLimitsRefused(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"status=0", ""},
		{"status=200001", "want 1–100000"},
		{"polls=5", `unknown request class "polls"`},
		{"status", "want class=N"},
		{"status=-1", "want 1–100000"},
	} {
		_, err := controlapi.ParseAdmission(tc.in)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("ParseAdmission(%q): %v, want %q", tc.in, err, tc.want)
		}
	}
	a, err := controlapi.ParseAdmission("status=7, ack=9")
	if err != nil || a[controlapi.ClassStatus] != 7 || a[controlapi.ClassAck] != 9 || a.String() != "ack=9,status=7" {
		t.Fatalf("ParseAdmission: %v %v", a, err)
	}
}

// identityClient is an HTTP client with the identity enrollment wrote in
// dir, trusting e's CA.
func (e *env) identityClient(t *testing.T, dir string) *http.Client {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "identity", controlclient.CertFile), filepath.Join(dir, "identity", controlclient.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(e.caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
