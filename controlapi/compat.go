package controlapi

import (
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/fleet"
)

// The admin API's wire types and client moved to controlapi/adminapi
// (issue 33). These aliases keep the end-to-end tests of cmd/cellvisor,
// which start a control API and call it, compiling until they import
// adminapi themselves; nothing else may use them, and they go then.
type (
	AdminClient         = adminapi.Client
	CreatedEdge         = adminapi.CreatedEdge
	DomainRequest       = adminapi.DomainRequest
	DomainView          = adminapi.DomainView
	EdgeRequest         = adminapi.EdgeRequest
	EdgeUpdateRequest   = adminapi.EdgeUpdateRequest
	EdgeView            = adminapi.EdgeView
	EgressPolicyRequest = adminapi.EgressPolicyRequest
	FrontDoorRequest    = adminapi.FrontDoorRequest
	LeaseView           = adminapi.LeaseView
	PoolRequest         = adminapi.PoolRequest
	PublishedView       = adminapi.PublishedView
	TaskRequest         = adminapi.TaskRequest
)

// The fleet page's paths, for the same tests: see controlapi/fleet.
const (
	FleetPath  = fleet.Path
	FleetLogin = fleet.Login
)
