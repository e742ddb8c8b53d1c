// Package adminapi is the admin API's wire contract: its paths, the
// requests and views it exchanges, the constants they name (enrollment and
// move states, token lifetimes, defaults), and Client, which calls it. It
// links no part of the server, so that a caller links no database:
// controlapi serves the contract (its fleet page shows the same views),
// controlapi/store records its move states, and cellvisor-control's
// subcommands and cellvisor-demo call it through Client. Only controlapi,
// controlapi/fleet, controlapi/store, cmd/cellvisor-control and
// cmd/cellvisor-demo import it.
package adminapi

import "time"

// Admin API paths.
const (
	PathCA      = "/v1/ca"
	PathEdges   = "/v1/edges"
	PathPools   = "/v1/pools"
	PathDomains = "/v1/domains"
	PathRouting = "/v1/routing"
	// PathKeys is the signing key's: POST PathKeys+"/rotate".
	PathKeys = "/v1/keys"
	// PathEgress is governed egress's root: policies/{org}/{class} and
	// leases.
	PathEgress = "/v1/egress"
	// PathFrontDoors lists front doors (GET) and resolves a URL (GET
	// PathFrontDoors/resolve?url=U[&org=O]); an edge's own is set (PUT)
	// and cleared (DELETE) at PathEdges/{id}/frontdoor.
	PathFrontDoors = "/v1/frontdoors"
	// PathFleet is the fleet page's, for browsers (controlapi/fleet).
	PathFleet = "/fleet"
)

// Enrollment states.
const (
	EnrollmentPending  = "pending"
	EnrollmentEnrolled = "enrolled"
)

// DefaultSlots is an edge's slot count unless chosen at creation.
const DefaultSlots = 8

// Bootstrap token lifetimes.
const (
	// DefaultTokenTTL is how long a bootstrap token enrolls unless the
	// admin request says otherwise.
	DefaultTokenTTL = 24 * time.Hour
	// MinTokenTTL and MaxTokenTTL bound what an admin request may ask.
	MinTokenTTL = time.Minute
	MaxTokenTTL = 30 * 24 * time.Hour
)

// Move states. A move (and a cell's drain) is under way while waiting
// (its target cells are receiving the domain) or draining (routing
// switched; the source cells serve until the drain interval passed); it
// ends done, failed or cancelled.
const (
	MoveWaiting   = "waiting"
	MoveDraining  = "draining"
	MoveDone      = "done"
	MoveFailed    = "failed"
	MoveCancelled = "cancelled"
)

// DefaultFrontDoorService is the gateway service a front door is set on
// when the request names none: the edge's public HTTPS group.
const DefaultFrontDoorService = "https"
