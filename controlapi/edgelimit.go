package controlapi

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/store"
)

// Elections per edge: an election reads the org's live members and, for
// the holder, renews its lease (a database write), so one edge calling in a
// loop would cost the control plane a write per call. An honest agent
// elects once per renewal (a third of the lease), and about once a second
// per class while nobody holds the lease; the bucket leaves it ample room.
const (
	electBurst = 20
	electRate  = 5 // per second, refilled continuously
	// limiterPrune is the number of buckets at which full ones are dropped.
	limiterPrune = 4096
)

// edgeLimiter is a token bucket per edge, on the wall clock (a test's fake
// clock does not starve it).
type edgeLimiter struct {
	burst, rate float64
	now         func() time.Time

	mu sync.Mutex // guards buckets
	// buckets are the edges' tokens and when they were counted.
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newEdgeLimiter(burst, rate float64) *edgeLimiter {
	return &edgeLimiter{burst: burst, rate: rate, now: time.Now, buckets: map[string]*bucket{}}
}

// allow takes a token of edge's, or answers how long until one is there.
func (l *edgeLimiter) allow(edge string) (bool, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[edge]
	if b == nil {
		if len(l.buckets) >= limiterPrune {
			l.prune(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[edge] = b
	}
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(l.burst, b.tokens+d.Seconds()*l.rate)
	}
	b.at = now
	if b.tokens < 1 {
		return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	}
	b.tokens--
	return true, 0
}

// prune drops the buckets that are full again: their edges are idle.
func (l *edgeLimiter) prune(now time.Time) {
	for id, b := range l.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.buckets, id)
		}
	}
}

// limited serves h to an edge within its bucket; beyond it, 429 with a
// random Retry-After (see refuse), counted as its class's edge_rate and
// logged (at most the refused call itself: no write).
func (s *Server) limited(class string, l *edgeLimiter, h edgeFunc) edgeFunc {
	return func(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
		if ok, _ := l.allow(st.ID); !ok {
			s.log.Warn("security: edge over its rate of calls", zap.String("edge", st.ID), zap.String("path", r.URL.Path))
			s.refuse(w, r, class, "edge_rate", fmt.Sprintf("more than %d calls at once, %d a second, to %s", electBurst, electRate, r.URL.Path))
			return nil
		}
		return h(w, r, st)
	}
}
