package controlclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/manifest"
)

// fakeControl serves the edge-control API's paths with handlers a test
// chooses, over mutual TLS, and returns a client of it.
func fakeControl(t *testing.T, mux *http.ServeMux) *Client {
	t.Helper()
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	writePEM := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writePEM(ServerCAFile, "CERTIFICATE", srv.Certificate().Raw)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edge"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(CertFile, "CERTIFICATE", der)
	kder, _ := x509.MarshalECPrivateKey(key)
	writePEM(KeyFile, "EC PRIVATE KEY", kder)
	c, err := New(Options{URL: srv.URL, Dir: dir, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdle)
	return c
}

// The wire contract (edgeapi): lenient where unsigned, so that a newer
// control API does not break this agent; strict where signed.
func TestDecodingIsStrictWhereSignedAndLenientElsewhere(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+edgeapi.PathTasks, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`[{"id":7,"cell":"cell-01","action":"drain","created_at":"2026-01-02T03:04:05Z","priority":"high","new":{"x":1}}]`))
	})
	mux.HandleFunc("GET "+edgeapi.PathManifest, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"edge_id":"e","sequence":2,"entries":[],"extra":"not covered by any signature"}`))
	})
	mux.HandleFunc("GET "+edgeapi.PathArtifacts+"{sha}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte(`{"error":"` + strings.Repeat("x", 10000) + `\u001b[2J\n","hint":"newer field"}`))
	})
	c := fakeControl(t, mux)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	tasks, err := c.Tasks(ctx)
	if err != nil || len(tasks) != 1 || tasks[0].ID != 7 || tasks[0].Action != edgeapi.ActionDrain {
		t.Errorf("tasks with an unknown field: %+v, %v; want accepted", tasks, err)
	}
	if _, err := c.Page(ctx, 1, ""); !errors.Is(err, manifest.ErrInvalid) || !strings.Contains(err.Error(), `unknown field "extra"`) {
		t.Errorf("page with an unknown field: %v; want refused", err)
	}
	_, err = c.Artifact(ctx, strings.Repeat("a", 64))
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusTeapot || len(he.Message) > manifest.MaxReasonBytes || strings.ContainsAny(he.Message, "\x1b\n") {
		t.Errorf("error body: %v; want its message bounded and escaped", err)
	}
}

// A snapshot the control API will not serve now (503: its slots; 429: this
// edge's or its org's share) is ErrSnapshotBusy, for the activation to page
// the manifest; other failures are not (issue 32 §3).
func TestSnapshotBusyIsToldApart(t *testing.T) {
	for _, tc := range []struct {
		code int
		busy bool
	}{{http.StatusServiceUnavailable, true}, {http.StatusTooManyRequests, true}, {http.StatusInternalServerError, false}} {
		t.Run(http.StatusText(tc.code), func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("GET "+edgeapi.PathSnapshot, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "10")
				http.Error(w, `{"error":"not now"}`, tc.code)
			})
			c := fakeControl(t, mux)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := c.Snapshot(ctx)
			var he *HTTPError
			if errors.Is(err, manifest.ErrSnapshotBusy) != tc.busy || !errors.As(err, &he) || he.Status != tc.code {
				t.Errorf("HTTP %d: %v; want busy %v, the HTTP error kept", tc.code, err, tc.busy)
			}
		})
	}
}

// With LongPoll set, a first-page poll asks the control API to hold it
// (whole seconds, at most edgeapi.MaxWait) and waits for it past Timeout;
// a page after a cursor is never held.
func TestLongPollAsksForAHold(t *testing.T) {
	mux := http.NewServeMux()
	waits := make(chan string, 3)
	mux.HandleFunc("GET "+edgeapi.PathManifest, func(w http.ResponseWriter, r *http.Request) {
		waits <- r.URL.Query().Get(edgeapi.QueryWait)
		if r.URL.Query().Get(edgeapi.QueryWait) != "" {
			time.Sleep(1500 * time.Millisecond) // a hold, longer than the client's Timeout below
		}
		w.WriteHeader(http.StatusNotModified)
	})
	c := fakeControl(t, mux)
	c.o.Timeout = time.Second
	c.o.LongPoll = 5 * time.Minute // capped at edgeapi.MaxWait
	if _, err := c.Page(context.Background(), 3, ""); !errors.Is(err, manifest.ErrNoChange) {
		t.Fatalf("held poll: %v, want no change (the hold is within Timeout plus LongPoll)", err)
	}
	if got := <-waits; got != "120" {
		t.Fatalf("wait=%q, want 120", got)
	}
	c.Page(context.Background(), 3, "4:a.example") // its answer aside: what it asked for
	if got := <-waits; got != "" {
		t.Fatalf("a page after a cursor asked for a hold: wait=%q", got)
	}
	c.o.LongPoll = 0
	if _, err := c.Page(context.Background(), 3, ""); !errors.Is(err, manifest.ErrNoChange) {
		t.Fatal(err)
	}
	if got := <-waits; got != "" {
		t.Fatalf("a plain poll asked for a hold: wait=%q", got)
	}
}
