package adminapi

import (
	"context"
	"net/http"
	"net/url"
)

// UpdateEdge changes an edge's topology and ranking.
func (c *Client) UpdateEdge(ctx context.Context, id string, r EdgeUpdateRequest) (EdgeView, error) {
	var out EdgeView
	err := c.do(ctx, http.MethodPatch, PathEdges+"/"+url.PathEscape(id), r, &out)
	return out, err
}

func policyPath(org, class string) string {
	return PathEgress + "/policies/" + url.PathEscape(org) + "/" + url.PathEscape(class)
}

// SetEgressPolicy sets an org's policy for a class.
func (c *Client) SetEgressPolicy(ctx context.Context, org, class string, r EgressPolicyRequest) (EgressPolicyView, error) {
	var out EgressPolicyView
	err := c.do(ctx, http.MethodPut, policyPath(org, class), r, &out)
	return out, err
}

// EgressPolicy shows an org's policy for a class.
func (c *Client) EgressPolicy(ctx context.Context, org, class string) (EgressPolicyView, error) {
	var out EgressPolicyView
	err := c.do(ctx, http.MethodGet, policyPath(org, class), nil, &out)
	return out, err
}

// ClearEgressPolicy removes an org's policy for a class; the answer is the
// policy as it was.
func (c *Client) ClearEgressPolicy(ctx context.Context, org, class string) (EgressPolicyView, error) {
	var out EgressPolicyView
	err := c.do(ctx, http.MethodDelete, policyPath(org, class), nil, &out)
	return out, err
}

// EgressPolicies lists the policies of org, every org's for "".
func (c *Client) EgressPolicies(ctx context.Context, org string) ([]EgressPolicyView, error) {
	var out []EgressPolicyView
	err := c.do(ctx, http.MethodGet, PathEgress+"/policies?org="+url.QueryEscape(org), nil, &out)
	return out, err
}

// Leases lists the active leases of org, every org's for "".
func (c *Client) Leases(ctx context.Context, org string) ([]LeaseView, error) {
	var out []LeaseView
	err := c.do(ctx, http.MethodGet, PathEgress+"/leases?org="+url.QueryEscape(org), nil, &out)
	return out, err
}

// SetFrontDoor sets an edge's front door; the answer carries the canonical
// URL stored.
func (c *Client) SetFrontDoor(ctx context.Context, edgeID string, r FrontDoorRequest) (FrontDoorView, error) {
	var out FrontDoorView
	err := c.do(ctx, http.MethodPut, PathEdges+"/"+url.PathEscape(edgeID)+"/frontdoor", r, &out)
	return out, err
}

// ClearFrontDoor removes an edge's front door.
func (c *Client) ClearFrontDoor(ctx context.Context, edgeID string) error {
	return c.do(ctx, http.MethodDelete, PathEdges+"/"+url.PathEscape(edgeID)+"/frontdoor", nil, nil)
}

// FrontDoors lists the front doors, of one org or ("") of all.
func (c *Client) FrontDoors(ctx context.Context, org string) ([]FrontDoorView, error) {
	var out []FrontDoorView
	path := PathFrontDoors
	if org != "" {
		path += "?org=" + url.QueryEscape(org)
	}
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// Resolve resolves a URL to its edge, within one org or ("") all. A
// refusal is an *Error whose Reason is the stable code.
func (c *Client) Resolve(ctx context.Context, rawURL, org string) (ResolveView, error) {
	var out ResolveView
	q := url.Values{"url": {rawURL}}
	if org != "" {
		q.Set("org", org)
	}
	err := c.do(ctx, http.MethodGet, PathFrontDoors+"/resolve?"+q.Encode(), nil, &out)
	return out, err
}
