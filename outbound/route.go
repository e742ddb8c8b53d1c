package outbound

import (
	"time"

	"cellvisor/edgeapi"
)

// route is one class's route, decided from an election answer.
type route struct {
	mode        string // edgeapi.Route*
	stage       string
	reason      string
	alone       bool
	holder      string
	holderURL   string
	epoch       int64 // this edge's epoch when it holds the lease, else the holder's
	expires     time.Time
	destination string
	at          time.Time
	// renew is the control API's renewal cadence (a third of the lease):
	// a fence's answer older than half of it is not trusted for a send.
	renew time.Duration
}

// routeFrom turns the control API's answer into a route for self: direct
// when self holds the lease or is alone (with epoch 0 when alone without a
// lease: a fallback send), proxy when another edge holds it, refused when
// the cascade refused, unknown while nobody holds a lease yet.
func routeFrom(r edgeapi.ElectResponse, self string, at time.Time) route {
	rt := route{mode: edgeapi.RouteUnknown, stage: r.Stage, reason: r.Reason, alone: r.Alone, destination: r.Destination, at: at, renew: r.Renew}
	if h := r.Holder; h != nil {
		rt.holder, rt.holderURL, rt.epoch, rt.expires = h.EdgeID, h.IntakeURL, h.Epoch, h.ExpiresAt
	}
	switch {
	case r.Outcome == edgeapi.OutcomeRefused:
		rt.mode = edgeapi.RouteRefused
	case rt.holder == self && rt.epoch > 0:
		rt.mode = edgeapi.RouteDirect
	case r.Alone:
		rt.mode, rt.epoch = edgeapi.RouteDirect, 0
	case rt.holder != "":
		rt.mode = edgeapi.RouteProxy
	}
	return rt
}

// holds reports a route on which this edge sends as the lease holder.
func (r route) holds() bool { return r.mode == edgeapi.RouteDirect && r.epoch > 0 }
