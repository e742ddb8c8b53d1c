package corpingest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"cellvisor/edgeapi"
)

func post(t *testing.T, s *Server, b edgeapi.Bundle, sender, epoch string) int {
	t.Helper()
	data, _ := json.Marshal(b)
	r := httptest.NewRequest(http.MethodPost, "/ingest", bytes.NewReader(data))
	r.Header.Set(edgeapi.HeaderBundleID, b.ID)
	r.Header.Set(edgeapi.HeaderSender, sender)
	r.Header.Set(edgeapi.HeaderEpoch, epoch)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w.Code
}

func TestIngestIsIdempotentAndCounts(t *testing.T) {
	s := New()
	a := edgeapi.Bundle{ID: "a1", Class: "metering", Items: json.RawMessage(`[]`)}
	b := edgeapi.Bundle{ID: "b1", Class: "siem_forwarding", Items: json.RawMessage(`[]`)}
	for _, c := range []struct {
		b             edgeapi.Bundle
		sender, epoch string
		want          int
	}{{a, "e1", "3", 200}, {a, "e2", "0", 200}, {b, "e1", "4", 200}, {a, "e1", "x", 400}} {
		if got := post(t, s, c.b, c.sender, c.epoch); got != c.want {
			t.Fatalf("post %s from %s@%s: HTTP %d, want %d", c.b.ID, c.sender, c.epoch, got, c.want)
		}
	}
	if got := s.Total(); got != (Counts{Received: 3, Unique: 2, Duplicate: 1}) {
		t.Fatalf("total %+v", got)
	}
	if got := s.Class("metering"); got != (Counts{Received: 2, Unique: 1, Duplicate: 1}) {
		t.Fatalf("metering %+v", got)
	}
	keys := s.ByKey()
	if keys[Key{"metering", "e1", 3}] != (Counts{Received: 1, Unique: 1}) || keys[Key{"metering", "e2", 0}] != (Counts{Received: 1, Duplicate: 1}) {
		t.Fatalf("by key %+v", keys)
	}
	d := s.Deliveries()
	if len(d) != 3 || d[0].Bundle != "a1" || d[0].Duplicate || !d[1].Duplicate || d[1].Key != (Key{"metering", "e2", 0}) ||
		d[2].Bundle != "b1" || d[2].At.Before(d[0].At) {
		t.Fatalf("deliveries %+v: want a1, a1 again (duplicate, from e2), b1, in order", d)
	}
	s.Fail(1)
	if got := post(t, s, b, "e1", "4"); got != http.StatusServiceUnavailable {
		t.Fatalf("while failing: HTTP %d", got)
	}
	if got := post(t, s, edgeapi.Bundle{ID: "c1", Class: "metering"}, "e1", "1"); got != 200 {
		t.Fatalf("after the failure: HTTP %d", got)
	}
	// A body whose id differs from the header is refused.
	data, _ := json.Marshal(a)
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(data))
	r.Header.Set(edgeapi.HeaderBundleID, "other")
	r.Header.Set(edgeapi.HeaderEpoch, "1")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest {
		t.Fatalf("mismatched id: HTTP %d", w.Code)
	}
}
