package adminapi

import "time"

// FrontDoorRequest sets an edge's front door.
type FrontDoorRequest struct {
	// URL is normalized (frontdoor.Normalize) before it is stored; a URL
	// the resolver would refuse as malformed is refused here.
	URL string `json:"url"`
	// Service is the edge's gateway service; empty means
	// DefaultFrontDoorService.
	Service string `json:"service,omitempty"`
}

// FrontDoorView is a gateway row with its front door.
type FrontDoorView struct {
	URL      string `json:"url"`
	EdgeID   string `json:"edge_id"`
	Org      string `json:"org"`
	Service  string `json:"service"`
	Protocol string `json:"protocol,omitempty"`
	Host     string `json:"host,omitempty"`
	Port     int    `json:"port,omitempty"`
	TLS      bool   `json:"tls"`
	MTLS     bool   `json:"mtls"`
	Region   string `json:"region,omitempty"`
	Zone     string `json:"zone,omitempty"`
	Locality string `json:"locality,omitempty"`
	Priority int    `json:"priority"`
	CostTier int    `json:"cost_tier"`
	Weight   int    `json:"weight"`
	// RTTMicros is the edge's last reported round trip to the control API.
	RTTMicros int64      `json:"rtt_us"`
	Healthy   bool       `json:"healthy"`
	LastSeen  *time.Time `json:"last_seen,omitempty"`
	SetAt     *time.Time `json:"set_at,omitempty"`
}

// ResolveView is a resolve's answer: the edge (200), or the refusal's
// stable Reason with a 4xx (400 malformed, 404 unmapped, 409 ambiguous or
// corrupt_row).
type ResolveView struct {
	URL       string `json:"url"`
	Canonical string `json:"canonical,omitempty"`
	Org       string `json:"org,omitempty"`
	EdgeID    string `json:"edge_id,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Error     string `json:"error,omitempty"`
}
