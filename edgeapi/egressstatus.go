package edgeapi

import "time"

// Routes of a class on the agent's send path.
const (
	RouteDirect  = "direct"  // this edge holds the lease (or is alone): it sends to the destination
	RouteProxy   = "proxy"   // it forwards to the holder's intake
	RouteRefused = "refused" // the election refused: bundles stay journaled
	RouteUnknown = "unknown" // not elected yet, or the control API unreachable
)

// EgressStatus is the egress part of the agent's status (admin socket and
// status report): the EgressReport the control API reads, plus the route
// per class and the journal, for operators. Its JSON is a superset of
// EgressReport's.
type EgressStatus struct {
	EgressReport
	Org     string        `json:"org,omitempty"`
	Routes  []RouteStatus `json:"routes,omitempty"`
	Journal JournalStatus `json:"journal"`
	// Error says why the send path is off (no org known, intake not
	// listening), empty when it runs.
	Error string `json:"error,omitempty"`
}

// RouteStatus is one class's route as the agent last resolved it.
type RouteStatus struct {
	Class  string `json:"class"`
	Route  string `json:"route"` // RouteDirect, RouteProxy, RouteRefused or RouteUnknown
	Stage  string `json:"stage,omitempty"`
	Reason string `json:"reason,omitempty"`
	Alone  bool   `json:"alone,omitempty"`
	// Holder is the lease holder's edge id, Epoch its fencing epoch and
	// Expires its lease's expiry, when a lease exists.
	Holder      string     `json:"holder,omitempty"`
	HolderURL   string     `json:"holder_url,omitempty"`
	Epoch       int64      `json:"epoch,omitempty"`
	Expires     *time.Time `json:"lease_expires,omitempty"`
	Destination string     `json:"destination,omitempty"`
	ElectedAt   *time.Time `json:"elected_at,omitempty"`
	// Pending is the class's journal depth; Delivered counts bundles
	// delivered since the agent started (direct, forwarded, fallback).
	Pending   int    `json:"pending"`
	Direct    int64  `json:"delivered_direct"`
	Forwarded int64  `json:"delivered_forwarded"`
	Fallback  int64  `json:"delivered_fallback"`
	LastError string `json:"last_error,omitempty"`
}

// JournalStatus is the bundle journal: its depth, bounds and refusals.
type JournalStatus struct {
	Bundles    int   `json:"bundles"`
	Bytes      int64 `json:"bytes"`
	MaxBundles int   `json:"max_bundles"`
	MaxBytes   int64 `json:"max_bytes"`
	// Refused counts bundles refused at the bound since the agent started
	// (produced ones and forwards alike); Damaged counts files set aside
	// at start as unreadable.
	Refused   int64  `json:"refused"`
	Damaged   int    `json:"damaged,omitempty"`
	LastError string `json:"last_error,omitempty"`
}
