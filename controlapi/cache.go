package controlapi

import (
	"context"
	"sync"
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
	st  *store.Store
	log *zap.Logger

	refreshMu sync.Mutex // serializes refreshes

	mu    sync.RWMutex // guards the following fields
	gen   int64
	edges map[string]store.EdgeState
	seen  map[string]time.Time // last seen, not yet written
}

func newCache(st *store.Store, log *zap.Logger) *cache {
	return &cache{st: st, log: log, edges: map[string]store.EdgeState{}, seen: map[string]time.Time{}}
}

// refresh loads the edges changed since the last refresh.
func (c *cache) refresh(ctx context.Context) error {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	c.mu.RLock()
	since := c.gen
	c.mu.RUnlock()
	states, gen, err := c.st.EdgeStates(ctx, since)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range states {
		c.edges[st.ID] = st
	}
	c.gen = gen
	return nil
}

// get returns an edge's cached state.
func (c *cache) get(id string) (store.EdgeState, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	st, ok := c.edges[id]
	return st, ok
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

// see records that an edge was seen.
func (c *cache) see(id string, at time.Time) {
	c.mu.Lock()
	c.seen[id] = at
	c.mu.Unlock()
}

// lastSeen is when this replica last saw an edge, if not yet written.
func (c *cache) lastSeen(id string) time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.seen[id]
}

func (c *cache) takeSeen() map[string]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seen
	c.seen = map[string]time.Time{}
	return s
}

func (c *cache) restoreSeen(s map[string]time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, at := range s {
		if at.After(c.seen[id]) {
			c.seen[id] = at
		}
	}
}
