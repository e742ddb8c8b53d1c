package controlapi

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/store"
)

// cache holds what the poll path needs of every edge (current certificate
// serial, manifest sequence, pending tasks), so that a poll with nothing new
// touches no database. It only ever answers "nothing new": anything with a
// body is read from the database, so a stale cache delays, never leaks.
// It catches up by generation: every change to an edge bumps a counter.
type cache struct {
	st       *store.Store
	log      *zap.Logger
	wakeRate int // held polls a fan-out wakes a second

	refreshMu sync.Mutex // serializes refreshes

	mu      sync.RWMutex // guards the following fields (not an entry's seen)
	gen     int64
	edges   map[string]*cached
	fanouts []store.Fanout // above the lowest Built of edges, oldest first
}

// cached is one edge: its state; when this replica last saw it and last
// wrote that it did (unix milliseconds, 0 for never), set on the poll path
// under the read lock; and the status report this replica last wrote.
type cached struct {
	state   store.EdgeState
	wake    chan struct{} // closed when state changes; guarded by cache.mu (write)
	seen    atomic.Int64
	written atomic.Int64
	status  atomic.Pointer[statusMemo]
	// held counts the polls this replica holds for the edge: an edge with
	// a poll held is connected, so it is seen while held (seeHeld).
	held atomic.Int32
}

// statusMemo is a status report written: its digest and when.
type statusMemo struct {
	digest [32]byte
	at     time.Time
}

func newCache(st *store.Store, log *zap.Logger, wakeRate int) *cache {
	return &cache{st: st, log: log, wakeRate: wakeRate, edges: map[string]*cached{}}
}

// watch returns a channel closed when the edge's state changes (its
// sequence, pending tasks or certificate; a fan-out that concerns it) or
// the edge is deleted: what a held poll waits on. Nil for an unknown edge.
func (c *cache) watch(id string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.edges[id]
	if e == nil {
		return nil
	}
	if e.wake == nil {
		e.wake = make(chan struct{})
	}
	return e.wake
}

// wakeLocked wakes the polls held on e at once.
func (e *cached) wakeLocked() {
	if e.wake != nil {
		close(e.wake)
		e.wake = nil
	}
}

// wakePacedLocked wakes the polls held on es, each at a random moment
// within len(es)/wakeRate seconds: their builds spread out instead of
// arriving together after a publish.
func (c *cache) wakePacedLocked(es []*cached) {
	spread := time.Duration(len(es)) * time.Second / time.Duration(c.wakeRate)
	for _, e := range es {
		ch := e.wake
		e.wake = nil // a new hold watches anew
		time.AfterFunc(rand.N(spread+1), func() { close(ch) })
	}
}

// refresh loads the edges changed since the last refresh.
func (c *cache) refresh(ctx context.Context) error {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	c.mu.RLock()
	since := c.gen
	c.mu.RUnlock()
	states, deleted, gen, err := c.st.EdgeStates(ctx, since)
	if err != nil {
		return err
	}
	var fanouts []store.Fanout
	if gen != since {
		if fanouts, err = c.st.Fanouts(ctx, since, gen); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range deleted {
		if e := c.edges[id]; e != nil {
			e.wakeLocked()
		}
		delete(c.edges, id)
	}
	for _, st := range states {
		if e := c.edges[st.ID]; e != nil {
			if st.Gen >= e.state.Gen { // not behind what built() set
				e.state = st
				e.wakeLocked()
			}
		} else {
			c.edges[st.ID] = &cached{state: st}
		}
	}
	if len(fanouts) > 0 {
		var held []*cached
		for _, e := range c.edges {
			if e.wake == nil {
				continue
			}
			for _, f := range fanouts {
				if f.Gen > e.state.Built && f.Concerns(e.state.Pools) {
					held = append(held, e)
					break
				}
			}
		}
		c.wakePacedLocked(held)
	}
	c.fanouts = append(c.fanouts, fanouts...)
	if len(c.fanouts) > 0 && (len(states) > 0 || len(deleted) > 0) {
		c.pruneFanoutsLocked()
	}
	c.gen = gen
	return nil
}

// pruneFanoutsLocked drops the fan-outs every edge is built past.
func (c *cache) pruneFanoutsLocked() {
	low := int64(-1)
	for _, e := range c.edges {
		if low < 0 || e.state.Built < low {
			low = e.state.Built
		}
	}
	i := 0
	for i < len(c.fanouts) && c.fanouts[i].Gen <= low {
		i++
	}
	c.fanouts = slices.Clip(c.fanouts[i:])
}

// unbuilt reports whether a fan-out the edge's manifest is not built past
// concerns one of its pools: its next poll builds it (store.Build).
func (c *cache) unbuilt(st store.EdgeState) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := len(c.fanouts) - 1; i >= 0 && c.fanouts[i].Gen > st.Built; i-- {
		if c.fanouts[i].Concerns(st.Pools) {
			return true
		}
	}
	return false
}

// built records an edge's manifest built by this replica, ahead of the
// next refresh.
func (c *cache) built(id string, b store.Built) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.edges[id]; e != nil && b.Gen > e.state.Gen {
		e.state.Sequence, e.state.Built, e.state.Gen = b.Sequence, b.Gen, b.Gen
	}
}

// get returns an edge's cached state.
func (c *cache) get(id string) (store.EdgeState, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.edges[id]
	if e == nil {
		return store.EdgeState{}, false
	}
	return e.state, true
}

// current reports whether serial is the edge's current certificate,
// refreshing once from the database before saying no (the edge may have
// enrolled through another replica a moment ago).
func (c *cache) current(ctx context.Context, id, serial string) (store.EdgeState, bool) {
	if st, ok := c.get(id); ok && st.CertSerial == serial && serial != "" {
		return st, true
	}
	if err := c.refresh(ctx); err != nil {
		c.log.Warn("refresh edge cache", zap.Error(err))
	}
	st, ok := c.get(id)
	return st, ok && st.CertSerial == serial && serial != ""
}

// see records that an edge was seen: no write lock, as it is on every poll.
func (c *cache) see(id string, at time.Time) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e := c.edges[id]; e != nil {
		e.seen.Store(at.UnixMilli())
	}
}

// holding counts a poll held for the edge (delta 1) or ended (-1).
func (c *cache) holding(id string, delta int32) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e := c.edges[id]; e != nil {
		e.held.Add(delta)
	}
}

// seeHeld marks every edge with a poll held here seen at now: the poll is
// the heartbeat, and a held one is one in progress.
func (c *cache) seeHeld(now time.Time) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, e := range c.edges {
		if e.held.Load() > 0 {
			e.seen.Store(now.UnixMilli())
		}
	}
}

// lastSeen is when this replica last saw an edge (zero for never).
func (c *cache) lastSeen(id string) time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e := c.edges[id]; e != nil {
		if ms := e.seen.Load(); ms != 0 {
			return time.UnixMilli(ms).UTC()
		}
	}
	return time.Time{}
}

// allSeen returns when this replica last saw each edge it saw.
func (c *cache) allSeen() map[string]time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]time.Time, len(c.edges))
	for id, e := range c.edges {
		if ms := e.seen.Load(); ms != 0 {
			out[id] = time.UnixMilli(ms).UTC()
		}
	}
	return out
}

// dueSeen returns the last-seen times to write: those that moved by at
// least bound since this replica last wrote the edge's (all that moved,
// for 0).
func (c *cache) dueSeen(bound time.Duration) map[string]time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]time.Time{}
	for id, e := range c.edges {
		seen, written := e.seen.Load(), e.written.Load()
		if seen != 0 && seen > written && (written == 0 || seen-written >= bound.Milliseconds()) {
			out[id] = time.UnixMilli(seen).UTC()
		}
	}
	return out
}

// wroteSeen records last-seen times written.
func (c *cache) wroteSeen(s map[string]time.Time) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for id, at := range s {
		if e := c.edges[id]; e != nil {
			ms := at.UnixMilli()
			for {
				w := e.written.Load()
				if w >= ms || e.written.CompareAndSwap(w, ms) {
					break
				}
			}
		}
	}
}

// statusUnchanged reports whether this replica wrote a status report of
// digest for the edge less than rewrite ago.
func (c *cache) statusUnchanged(id string, digest [32]byte, now time.Time, rewrite time.Duration) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.edges[id]
	if e == nil {
		return false
	}
	m := e.status.Load()
	return m != nil && m.digest == digest && now.Sub(m.at) < rewrite && !now.Before(m.at)
}

// wroteStatus records a status report written (forget: one whose write
// failed, so that the next is written whatever it holds).
func (c *cache) wroteStatus(id string, digest [32]byte, at time.Time, forget bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e := c.edges[id]; e != nil {
		if forget {
			e.status.Store(nil)
			return
		}
		e.status.Store(&statusMemo{digest: digest, at: at})
	}
}
