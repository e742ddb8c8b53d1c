package controlapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"

	"cellvisor/controlapi/fleet"
	"cellvisor/controlapi/store"
)

// The fleet page's runtime summary: which runtime versions the cells run,
// and which edges still have cells on a superseded one (a package upgrade
// not rolled onto yet), from each enrolled edge's last status report. As
// the pool series do (fleet_metrics.go), a report is decoded only when its
// stamp moved since the page was last shown.

// reportedRuntime is the part of a status report the summary reads.
type reportedRuntime struct {
	Runtime *struct {
		Version string `json:"version"`
		Upgrade string `json:"upgrade"`
		Reason  string `json:"reason"`
	} `json:"runtime"`
	Slots []struct {
		Runtime *struct {
			Version    string `json:"version"`
			Superseded bool   `json:"superseded"`
		} `json:"runtime"`
	} `json:"slots"`
}

// maxRuntimeVersion bounds a reported version kept (it is agent text).
const maxRuntimeVersion = 64

// edgeRuntime is what the summary keeps of one report.
type edgeRuntime struct {
	stamp      store.ReportStamp
	cells      map[string]int // running cells by version
	superseded int
	current    string
	upgrade    string
	reason     string
}

// readRuntime decodes a report's runtimes; ok is false for one that does
// not decode.
func readRuntime(status []byte) (edgeRuntime, bool) {
	var rep reportedRuntime
	if json.Unmarshal(status, &rep) != nil {
		return edgeRuntime{}, false
	}
	r := edgeRuntime{cells: map[string]int{}}
	for _, c := range rep.Slots {
		if c.Runtime == nil {
			continue // not running, or its file could not be told
		}
		v := c.Runtime.Version
		if v == "" {
			v = "unknown"
		}
		if len(v) > maxRuntimeVersion {
			v = v[:maxRuntimeVersion]
		}
		if _, ok := r.cells[v]; ok || len(r.cells) < maxReportedPools {
			r.cells[v]++
		}
		if c.Runtime.Superseded {
			r.superseded++
		}
	}
	if rt := rep.Runtime; rt != nil {
		r.current, r.upgrade, r.reason = rt.Version, rt.Upgrade, rt.Reason
	}
	return r, true
}

// runtimeSummary keeps the decoded reports between two views of the page.
type runtimeSummary struct {
	mu   sync.Mutex // guards kept
	kept map[string]edgeRuntime
}

// read sums up every enrolled edge's last report, with at most limit of
// the edges that have cells on a superseded runtime (by name).
func (rs *runtimeSummary) read(ctx context.Context, st *store.Store, limit int) (fleet.Runtimes, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out fleet.Runtimes
	stamps, err := st.ReportStamps(ctx)
	if err != nil {
		return out, err
	}
	var moved []string
	for _, s := range stamps {
		if k, ok := rs.kept[s.ID]; !ok || k.stamp != s {
			moved = append(moved, s.ID)
		}
	}
	reports, err := st.EdgeReports(ctx, moved)
	if err != nil {
		return out, err
	}
	next := make(map[string]edgeRuntime, len(stamps))
	for _, r := range reports {
		er, ok := readRuntime(r.Status)
		if !ok {
			er = edgeRuntime{}
		}
		er.stamp = r.ReportStamp
		next[r.ID] = er
	}
	versions := map[string]*fleet.RuntimeVersion{}
	var superseded []fleet.SupersededEdge
	for _, s := range stamps {
		er, ok := next[s.ID]
		if !ok {
			if er, ok = rs.kept[s.ID]; !ok {
				continue // deleted or its report gone between the two queries
			}
			next[s.ID] = er
		}
		for v, n := range er.cells {
			rv := versions[v]
			if rv == nil {
				rv = &fleet.RuntimeVersion{Version: v}
				versions[v] = rv
			}
			rv.Edges++
			rv.Cells += n
		}
		if er.superseded > 0 {
			superseded = append(superseded, fleet.SupersededEdge{EdgeID: s.ID, Cells: er.superseded,
				Current: er.current, Upgrade: er.upgrade, Reason: er.reason})
		}
	}
	rs.kept = next // edges gone since are dropped
	for _, v := range versions {
		out.Versions = append(out.Versions, *v)
	}
	slices.SortFunc(out.Versions, func(a, b fleet.RuntimeVersion) int { return cmp.Compare(a.Version, b.Version) })
	out.SupersededTotal = len(superseded)
	if len(superseded) > limit {
		superseded = superseded[:limit]
	}
	for i := range superseded {
		e, err := st.Edge(ctx, superseded[i].EdgeID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue // deleted since: shown by its id
		case err != nil:
			return out, err
		}
		superseded[i].EdgeName = e.Name
	}
	slices.SortFunc(superseded, func(a, b fleet.SupersededEdge) int { return cmp.Compare(a.EdgeName, b.EdgeName) })
	out.Superseded = superseded
	return out, nil
}
