package activation

import (
	"fmt"
	"maps"

	"cellvisor/manifest"
	"cellvisor/runtime"
)

// placement is what one manifest asks of the edge's cells: the assignments
// and pool limits in force once it is applied, and every assigned slot's
// own pool runtime (its pool's domains, less those the manifest gives to
// other cells).
type placement struct {
	assign runtime.Assignments
	limits map[string]runtime.PoolLimits
	// signed is true when the manifest carried assignments: they are
	// persisted once applied.
	signed bool
	slots  map[string]*runtime.PoolRuntime
}

// placementOf checks the manifest's assignments against the slots of this
// edge and its entries against the assignments in force once it is applied
// (its own, or the current ones when it carries none): an entry without
// cells is for every cell of its pool, which must have a cell here; the
// cells an entry names serve it, whatever their pool, and must all be
// assigned. It changes nothing.
func (a *Activator) placementOf(m manifest.Manifest) (placement, error) {
	a.mu.Lock()
	pl := placement{assign: maps.Clone(a.assign), limits: maps.Clone(a.limits)}
	a.mu.Unlock()
	if m.Assignments != nil {
		pl.signed = true
		pl.assign, pl.limits = runtime.Assignments{}, map[string]runtime.PoolLimits{}
		for cell, pool := range m.Assignments.Cells {
			if _, ok := a.o.Topology.Slot(cell); !ok {
				return placement{}, fmt.Errorf("%w: assignments: %s is not a cell of this edge (%d cells)", manifest.ErrInvalid, cell, len(a.o.Topology.Slots))
			}
			pl.assign[cell] = pool
		}
		for name, p := range m.Assignments.Pools {
			pl.limits[name] = runtime.PoolLimits{MaxConns: p.MaxConns, Rate: p.Rate, Burst: p.Burst}
		}
	}
	assigned := map[string]bool{}
	for _, pool := range pl.assign {
		assigned[pool] = true
	}
	for _, e := range m.Entries {
		if len(e.Cells) == 0 {
			if !assigned[e.Pool] {
				return placement{}, fmt.Errorf("%w: %s is for pool %s", errUnknownPool, e.Domain, e.Pool)
			}
			continue
		}
		// Named cells are authoritative and may be of any pool (a move
		// serves a domain from cells of two pools): each must be assigned.
		for _, c := range e.Cells {
			if _, ok := a.o.Topology.Slot(c); !ok {
				return placement{}, fmt.Errorf("%w: %s names %s, which is not a cell of this edge", errUnknownPool, e.Domain, c)
			}
			if pl.assign[c] == "" {
				return placement{}, fmt.Errorf("%w: %s names %s, which is not assigned here", errUnknownPool, e.Domain, c)
			}
		}
	}
	return pl, nil
}

// Assignments returns the cell assignments in force.
func (a *Activator) Assignments() runtime.Assignments {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.assign)
}
