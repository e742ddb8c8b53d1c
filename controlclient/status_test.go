package controlclient

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/internal/clock"
	"cellvisor/manifest"
)

// Status is sent when it changes, at once, and otherwise every status
// interval: the default until a poll answer assigns one, then that one,
// kept within its bounds. An unchanged report within the interval is not
// sent; one that failed is sent again at the next call.
func TestStatusSentOnChangeAndEveryInterval(t *testing.T) {
	var reports atomic.Int32
	var fail atomic.Bool
	var assign atomic.Value
	assign.Store("")
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+edgeapi.PathStatus, func(w http.ResponseWriter, r *http.Request) {
		reports.Add(1)
		if fail.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+edgeapi.PathManifest, func(w http.ResponseWriter, r *http.Request) {
		if v := assign.Load().(string); v != "" {
			w.Header().Set(edgeapi.HeaderStatusInterval, v)
		}
		w.WriteHeader(http.StatusNotModified)
	})
	c := fakeControl(t, mux)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c.o.Clock = clk
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	report := func(state string, conns int) edgeapi.StatusReport {
		return edgeapi.StatusReport{At: clk.Now(), Status: []byte(`{"version":"1","slots":[{"name":"cell-01","state":"` + state +
			`","cell":{"connections":` + string(rune('0'+conns)) + `}}]}`)}
	}
	step := func(name string, r edgeapi.StatusReport, wantSent bool) {
		t.Helper()
		before := reports.Load()
		sent, err := c.ReportChanged(ctx, r)
		if fail.Load() {
			if err == nil {
				t.Fatalf("%s: no error from a failed report", name)
			}
		} else if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if sent != wantSent || (reports.Load() > before) != wantSent {
			t.Fatalf("%s: sent %v (%d reports), want %v", name, sent, reports.Load()-before, wantSent)
		}
	}
	poll := func() {
		t.Helper()
		if _, err := c.Page(ctx, 1, ""); !errors.Is(err, manifest.ErrNoChange) {
			t.Fatal(err)
		}
	}

	if c.StatusInterval() != edgeapi.DefaultStatusInterval {
		t.Fatalf("status interval before any poll: %s, want the default", c.StatusInterval())
	}
	step("first", report("ready", 1), true)
	step("measurements only", report("ready", 2), false)
	clk.Advance(edgeapi.DefaultStatusInterval - time.Second)
	step("unchanged within the default interval", report("ready", 3), false)
	step("a change", report("degraded", 3), true)
	clk.Advance(edgeapi.DefaultStatusInterval)
	step("unchanged after the default interval", report("degraded", 4), true)

	assign.Store("60")
	poll()
	if c.StatusInterval() != time.Minute {
		t.Fatalf("assigned 60s: %s", c.StatusInterval())
	}
	clk.Advance(59 * time.Second)
	step("unchanged within the assigned interval", report("degraded", 5), false)
	clk.Advance(time.Second)
	step("unchanged after the assigned interval", report("degraded", 5), true)

	for _, tc := range []struct {
		header string
		want   time.Duration
	}{{"5", edgeapi.MinStatusInterval}, {"100000", edgeapi.MaxStatusInterval}, {"", edgeapi.MaxStatusInterval}, {"junk", edgeapi.MaxStatusInterval}, {"300", 5 * time.Minute}} {
		assign.Store(tc.header)
		poll()
		if got := c.StatusInterval(); got != tc.want {
			t.Errorf("assigned %q: %s, want %s", tc.header, got, tc.want)
		}
	}

	fail.Store(true)
	step("a change that fails", report("ready", 1), true)
	fail.Store(false)
	step("the same again after the failure", report("ready", 1), true)
	step("then unchanged", report("ready", 1), false)
}
