package controlapi

import (
	"context"
	"encoding/json"
	"sort"
	"sync"

	"go.uber.org/zap"

	"cellvisor/controlapi/metrics"
	"cellvisor/controlapi/store"
)

// The scrape-time readers behind the control API's fleet series
// (controlapi/metrics): egress lease holders, pools and each edge's ready
// cells per pool. Each is a few bounded queries, run once per scrape.

// maxLeaseSeries bounds the lease series of one scrape (three per
// (org, class) held).
const maxLeaseSeries = 10000

// metricLeases lists the egress leases held now: an active row past its
// expiry is nobody's (the next election ends it).
func (s *Server) metricLeases(ctx context.Context) ([]metrics.LeaseHolder, error) {
	ls, total, err := s.st.HeldLeases(ctx, s.o.Now(), maxLeaseSeries)
	if err != nil {
		return nil, err
	}
	if total > len(ls) {
		s.log.Warn("metrics: more egress leases than lease series", zap.Int("leases", total), zap.Int("exported", len(ls)))
	}
	out := make([]metrics.LeaseHolder, 0, len(ls))
	for _, l := range ls {
		out = append(out, metrics.LeaseHolder{Org: l.Org, Class: l.Class, Edge: l.Holder, Epoch: l.Epoch, Expires: l.ExpiresAt})
	}
	return out, nil
}

// reportedSlots is the part of a status report the pool series read.
type reportedSlots struct {
	Slots []struct {
		Pool    string `json:"pool"`
		State   string `json:"state"`
		Drained bool   `json:"drained"`
	} `json:"slots"`
}

// maxReportedPools bounds the pools kept from one report (an edge has at
// most 32 cells).
const maxReportedPools = 32

// readyCounts is what the pool series keep of one report: ready cells by
// the pool the report names (pools with none ready included), nil for a
// report that does not decode.
type readyCounts struct {
	stamp store.ReportStamp
	ready map[string]int
}

// countReady counts a report's ready cells by pool, nil when it does not
// decode. Ready is what placement counts (store.ReadyCells).
func countReady(status []byte) map[string]int {
	var rep reportedSlots
	if json.Unmarshal(status, &rep) != nil {
		return nil
	}
	ready := map[string]int{}
	for _, c := range rep.Slots {
		if c.Pool == "" {
			continue
		}
		if _, ok := ready[c.Pool]; !ok && len(ready) >= maxReportedPools {
			continue
		}
		n := ready[c.Pool]
		if c.State == "ready" && !c.Drained {
			n++
		}
		ready[c.Pool] = n
	}
	return ready
}

// poolsReader returns the reader of the pool series: every pool, and each
// reporting edge's ready cells in every pool it has cells in, assigned
// here or named by its report (a pool name no pool has adds no series).
// An edge that never reported, or whose report does not decode, is not
// judged, as placement does not judge it. Reports are decoded only when
// their stamp moved since the last scrape: a fleet whose reports did not
// change costs a query of stamps, not 10,000 decodes.
func (s *Server) poolsReader() func(ctx context.Context) (metrics.Pools, error) {
	var mu sync.Mutex // guards the following
	kept := map[string]readyCounts{}
	return func(ctx context.Context) (metrics.Pools, error) {
		mu.Lock()
		defer mu.Unlock()
		var out metrics.Pools
		pools, err := s.st.Pools(ctx)
		if err != nil {
			return out, err
		}
		domains, err := s.st.PoolDomains(ctx)
		if err != nil {
			return out, err
		}
		known := map[string]bool{}
		for _, p := range pools {
			known[p.Name] = true
			out.Pools = append(out.Pools, metrics.Pool{Name: p.Name, MinReady: p.MinReady, Domains: domains[p.Name]})
		}
		assigned, err := s.st.EdgePools(ctx)
		if err != nil {
			return out, err
		}
		stamps, err := s.st.ReportStamps(ctx)
		if err != nil {
			return out, err
		}
		var moved []string
		for _, st := range stamps {
			if k, ok := kept[st.ID]; !ok || k.stamp != st {
				moved = append(moved, st.ID)
			}
		}
		reports, err := s.st.EdgeReports(ctx, moved)
		if err != nil {
			return out, err
		}
		next := make(map[string]readyCounts, len(stamps))
		for _, r := range reports {
			next[r.ID] = readyCounts{stamp: r.ReportStamp, ready: countReady(r.Status)}
		}
		for _, st := range stamps {
			k, ok := next[st.ID]
			if !ok {
				if k, ok = kept[st.ID]; !ok {
					continue // deleted or its report gone between the two queries
				}
				next[st.ID] = k
			}
			if k.ready == nil {
				continue
			}
			ready := map[string]int{}
			for pool := range assigned[st.ID] {
				ready[pool] = 0
			}
			for pool, n := range k.ready {
				if known[pool] {
					ready[pool] = n
				}
			}
			names := make([]string, 0, len(ready))
			for pool := range ready {
				names = append(names, pool)
			}
			sort.Strings(names)
			for _, pool := range names {
				out.Ready = append(out.Ready, metrics.PoolReady{Edge: st.ID, Pool: pool, Ready: ready[pool]})
			}
		}
		kept = next // edges gone since are dropped
		return out, nil
	}
}
