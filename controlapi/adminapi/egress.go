package adminapi

import (
	"time"

	"cellvisor/edgeapi"
)

// EgressPolicyRequest sets an org's policy for a class (PUT
// /v1/egress/policies/{org}/{class}).
type EgressPolicyRequest struct {
	// Destination is the class's destination URL (http or https).
	Destination string `json:"destination"`
	// Region is the preferred residency region: its edges rank first.
	Region string `json:"region,omitempty"`
	// Require is the hard requirement on the owner; never relaxed.
	Require edgeapi.Requirement `json:"require,omitzero"`
}

// EgressPolicyView is a policy.
type EgressPolicyView struct {
	Org         string              `json:"org"`
	Class       string              `json:"class"`
	Destination string              `json:"destination"`
	Region      string              `json:"region,omitempty"`
	Require     edgeapi.Requirement `json:"require,omitzero"`
	UpdatedAt   time.Time           `json:"updated_at"`
}

// LeaseView is an active lease: who owns (org, class).
type LeaseView struct {
	Org        string    `json:"org"`
	Class      string    `json:"class"`
	Holder     string    `json:"holder"`
	HolderName string    `json:"holder_name,omitempty"`
	Region     string    `json:"region,omitempty"`
	Epoch      int64     `json:"epoch"`
	AcquiredAt time.Time `json:"acquired_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	// Expired: the holder did not renew; the next election ends it.
	Expired bool `json:"expired"`
}
