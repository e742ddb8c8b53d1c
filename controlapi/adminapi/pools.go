package adminapi

import "time"

// PoolRequest creates a pool (POST /v1/pools) or updates one (PATCH
// /v1/pools/{name}, without name and replicas). An absent field keeps its
// value: the class's default on create (see docs/placement.md).
type PoolRequest struct {
	Name string `json:"name,omitempty"`
	// Replicas per edge: 1 for shared and quarantine pools, 1–3 for
	// reserved and dedicated; set at creation only.
	Replicas *int `json:"replicas,omitempty"`
	// Bound is the most domains per cell; 0 for none.
	Bound *int `json:"bound,omitempty"`
	// MinReady is the fewest ready cells on an edge for new placements.
	MinReady *int `json:"min_ready,omitempty"`
	// Drain is a Go duration: how long a domain moving out keeps its cells.
	Drain    *string `json:"drain,omitempty"`
	MaxConns *int    `json:"max_conns,omitempty"`
	Rate     *int    `json:"rate,omitempty"`
	Burst    *int    `json:"burst,omitempty"`
}

// PoolView is a pool, with its cells on every edge for one pool.
type PoolView struct {
	Name      string    `json:"name"`
	Class     string    `json:"class"`
	Replicas  int       `json:"replicas"`
	Bound     int       `json:"bound"`
	MinReady  int       `json:"min_ready"`
	Drain     string    `json:"drain"`
	MaxConns  int       `json:"max_conns"`
	Rate      int       `json:"rate"`
	Burst     int       `json:"burst"`
	CreatedAt time.Time `json:"created_at"`
	// Edges are the pool's cells on each edge (shown for one pool).
	Edges []PoolHealth `json:"edges,omitempty"`
	// Sequences maps each edge whose manifest advanced (an update of the
	// cells' limits) to its new sequence.
	Sequences map[string]int64 `json:"sequences,omitempty"`
}

// PoolHealth is one pool's cells on one edge and whether enough of them
// are ready: below its minimum, the pool takes no new placements there.
type PoolHealth struct {
	Pool     string   `json:"pool"`
	EdgeID   string   `json:"edge_id"`
	EdgeName string   `json:"edge_name,omitempty"`
	Cells    []string `json:"cells"`
	// Ready counts the cells the edge reports ready; Reported is false
	// before its first status report (then it is not judged).
	Ready        int    `json:"ready"`
	Reported     bool   `json:"reported"`
	MinReady     int    `json:"min_ready"`
	BelowMinimum bool   `json:"below_minimum"`
	Reason       string `json:"reason,omitempty"`
}
