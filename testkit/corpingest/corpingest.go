// Package corpingest is a test destination for governed egress ("corp
// ingest"): an HTTP handler that takes bundles (POST, any path), ingests
// each bundle id once, and counts deliveries received, unique and
// duplicate, per class and per sender and epoch. Tests and the demo
// (cmd/cellvisor-demo) use it; the agent links none of it.
package corpingest

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"cellvisor/edgeapi"
)

// Key counts deliveries per class, sender and epoch (0: a fallback send
// by a non-holder).
type Key struct {
	Class  string
	Sender string
	Epoch  int64
}

// Counts are deliveries: every one received, the first of each bundle id
// (unique) and the rest (duplicates).
type Counts struct {
	Received, Unique, Duplicate int
}

// Delivery is one delivery received: when, of which bundle, under which
// key, and whether its id had been ingested before.
type Delivery struct {
	Key
	Bundle    string
	At        time.Time
	Duplicate bool
}

// Server is the ingest; its zero value is not usable, use New.
type Server struct {
	mu      sync.Mutex // guards the following fields
	log     []Delivery
	bundles map[string]edgeapi.Bundle
	byClass map[string]*Counts
	byKey   map[Key]*Counts
	total   Counts
	fail    int // answer this many deliveries with 503 (Fail)
}

// New returns an empty ingest.
func New() *Server {
	return &Server{bundles: map[string]edgeapi.Bundle{}, byClass: map[string]*Counts{}, byKey: map[Key]*Counts{}}
}

// ServeHTTP ingests one bundle: 200 when new, 200 again when a duplicate
// (idempotent), 400 when malformed, 503 while Fail says so.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST a bundle", http.StatusMethodNotAllowed)
		return
	}
	var b edgeapi.Bundle
	if err := json.NewDecoder(io.LimitReader(r.Body, edgeapi.MaxBundleBytes+1)).Decode(&b); err != nil || b.ID == "" {
		http.Error(w, "malformed bundle", http.StatusBadRequest)
		return
	}
	if h := r.Header.Get(edgeapi.HeaderBundleID); h != b.ID {
		http.Error(w, "bundle id header does not match the body", http.StatusBadRequest)
		return
	}
	epoch, err := strconv.ParseInt(r.Header.Get(edgeapi.HeaderEpoch), 10, 64)
	if err != nil {
		http.Error(w, "bad epoch header", http.StatusBadRequest)
		return
	}
	k := Key{Class: b.Class, Sender: r.Header.Get(edgeapi.HeaderSender), Epoch: epoch}
	s.mu.Lock()
	if s.fail > 0 {
		s.fail--
		s.mu.Unlock()
		http.Error(w, "ingest unavailable", http.StatusServiceUnavailable)
		return
	}
	_, dup := s.bundles[b.ID]
	if !dup {
		s.bundles[b.ID] = b
	}
	s.log = append(s.log, Delivery{Key: k, Bundle: b.ID, At: time.Now(), Duplicate: dup})
	for _, c := range []*Counts{&s.total, s.counts(s.byClass, b.Class), s.keyCounts(k)} {
		c.Received++
		if dup {
			c.Duplicate++
		} else {
			c.Unique++
		}
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (s *Server) counts(m map[string]*Counts, k string) *Counts {
	if m[k] == nil {
		m[k] = &Counts{}
	}
	return m[k]
}

func (s *Server) keyCounts(k Key) *Counts {
	if s.byKey[k] == nil {
		s.byKey[k] = &Counts{}
	}
	return s.byKey[k]
}

// Fail answers the next n deliveries with 503.
func (s *Server) Fail(n int) {
	s.mu.Lock()
	s.fail = n
	s.mu.Unlock()
}

// Total counts every delivery.
func (s *Server) Total() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Class counts a class's deliveries.
func (s *Server) Class(class string) Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.byClass[class]; c != nil {
		return *c
	}
	return Counts{}
}

// ByKey counts deliveries per class, sender and epoch.
func (s *Server) ByKey() map[Key]Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[Key]Counts, len(s.byKey))
	for k, c := range s.byKey {
		out[k] = *c
	}
	return out
}

// Deliveries lists every delivery received, in the order received.
func (s *Server) Deliveries() []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Delivery(nil), s.log...)
}

// Bundle returns an ingested bundle.
func (s *Server) Bundle(id string) (edgeapi.Bundle, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.bundles[id]
	return b, ok
}

// IDs lists the ingested bundle ids.
func (s *Server) IDs() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.bundles))
	for id := range s.bundles {
		out[id] = true
	}
	return out
}
