package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Client calls the admin API: cellvisor-control's subcommands, the
// demo and the tests use it.
type Client struct {
	// URL is the admin API's base URL, e.g. http://127.0.0.1:8442.
	URL string
	// Token is the admin bearer token.
	Token string
	// HTTP is the client, or nil for http.DefaultClient.
	HTTP *http.Client
}

// Error is a refusal by the admin API.
type Error struct {
	Status  int
	Message string
	// Reason is the stable code of a front-door resolve's refusal
	// (frontdoor.Reason), empty for other refusals.
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.URL, "/")+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error  string `json:"error"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		return &Error{Status: resp.StatusCode, Message: e.Error, Reason: e.Reason}
	}
	if out == nil {
		return nil
	}
	if s, ok := out.(*string); ok {
		*s = string(data)
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// CA returns the CA certificate (PEM).
func (c *Client) CA(ctx context.Context) (string, error) {
	var s string
	err := c.do(ctx, http.MethodGet, PathCA, nil, &s)
	return s, err
}

// CreateEdge creates an edge; the token in the answer is shown once.
func (c *Client) CreateEdge(ctx context.Context, r EdgeRequest) (CreatedEdge, error) {
	var out CreatedEdge
	err := c.do(ctx, http.MethodPost, PathEdges, r, &out)
	return out, err
}

// Edges lists the edges.
func (c *Client) Edges(ctx context.Context) ([]EdgeView, error) {
	var out []EdgeView
	err := c.do(ctx, http.MethodGet, PathEdges, nil, &out)
	return out, err
}

// Edge shows one edge with its status, acks and tasks.
func (c *Client) Edge(ctx context.Context, id string) (EdgeView, error) {
	var out EdgeView
	err := c.do(ctx, http.MethodGet, PathEdges+"/"+url.PathEscape(id), nil, &out)
	return out, err
}

// Rotate rotates an edge's identity: its certificate is refused from now
// on, and the answer carries a new one-time token, valid DefaultTokenTTL.
func (c *Client) Rotate(ctx context.Context, id string) (CreatedEdge, error) {
	return c.RotateWith(ctx, id, RotateRequest{})
}

// RotateWith is Rotate with the new token's lifetime.
func (c *Client) RotateWith(ctx context.Context, id string, r RotateRequest) (CreatedEdge, error) {
	var out CreatedEdge
	err := c.do(ctx, http.MethodPost, PathEdges+"/"+url.PathEscape(id)+"/rotate", r, &out)
	return out, err
}

// DeleteEdge removes an edge; the answer is the edge as it was.
func (c *Client) DeleteEdge(ctx context.Context, id string) (EdgeView, error) {
	var out EdgeView
	err := c.do(ctx, http.MethodDelete, PathEdges+"/"+url.PathEscape(id), nil, &out)
	return out, err
}

// CreateTask queues a control task for one of an edge's cells.
func (c *Client) CreateTask(ctx context.Context, edgeID string, r TaskRequest) (TaskView, error) {
	var out TaskView
	err := c.do(ctx, http.MethodPost, PathEdges+"/"+url.PathEscape(edgeID)+"/tasks", r, &out)
	return out, err
}

// Tasks lists an edge's newest tasks.
func (c *Client) Tasks(ctx context.Context, edgeID string) ([]TaskView, error) {
	var out []TaskView
	err := c.do(ctx, http.MethodGet, PathEdges+"/"+url.PathEscape(edgeID)+"/tasks", nil, &out)
	return out, err
}

// Pools lists the pools.
func (c *Client) Pools(ctx context.Context) ([]PoolView, error) {
	var out []PoolView
	err := c.do(ctx, http.MethodGet, PathPools, nil, &out)
	return out, err
}

// CreatePool creates a pool with the class's defaults.
func (c *Client) CreatePool(ctx context.Context, name string) (PoolView, error) {
	return c.CreatePoolWith(ctx, PoolRequest{Name: name})
}

// CreatePoolWith creates a pool with the settings r gives.
func (c *Client) CreatePoolWith(ctx context.Context, r PoolRequest) (PoolView, error) {
	var out PoolView
	err := c.do(ctx, http.MethodPost, PathPools, r, &out)
	return out, err
}

// Pool shows a pool and its cells on every edge.
func (c *Client) Pool(ctx context.Context, name string) (PoolView, error) {
	var out PoolView
	err := c.do(ctx, http.MethodGet, PathPools+"/"+url.PathEscape(name), nil, &out)
	return out, err
}

// UpdatePool changes a pool's bound, minimum, drain interval or limits.
func (c *Client) UpdatePool(ctx context.Context, name string, r PoolRequest) (PoolView, error) {
	var out PoolView
	err := c.do(ctx, http.MethodPatch, PathPools+"/"+url.PathEscape(name), r, &out)
	return out, err
}

// DeletePool deletes a pool without domains or cells.
func (c *Client) DeletePool(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, PathPools+"/"+url.PathEscape(name), nil, nil)
}

// AssignCell assigns an edge's cell to a pool; pool "" unassigns it.
func (c *Client) AssignCell(ctx context.Context, edge, cell, pool string) (CellAssignment, error) {
	var out CellAssignment
	path := PathEdges + "/" + url.PathEscape(edge) + "/cells/" + url.PathEscape(cell)
	if pool == "" {
		err := c.do(ctx, http.MethodDelete, path, nil, &out)
		return out, err
	}
	err := c.do(ctx, http.MethodPut, path, CellRequest{Pool: pool}, &out)
	return out, err
}

// Domain shows a domain, its cells and its latest move.
func (c *Client) Domain(ctx context.Context, name string) (DomainView, error) {
	var out DomainView
	err := c.do(ctx, http.MethodGet, PathDomains+"/"+url.PathEscape(name), nil, &out)
	return out, err
}

// Move starts moving a domain to pool to.
func (c *Client) Move(ctx context.Context, name, to string) (MoveView, error) {
	var out MoveView
	err := c.do(ctx, http.MethodPost, PathDomains+"/"+url.PathEscape(name)+"/move", MoveRequest{To: to}, &out)
	return out, err
}

// CancelMove ends a domain's move that has not switched.
func (c *Client) CancelMove(ctx context.Context, name string) (MoveView, error) {
	var out MoveView
	err := c.do(ctx, http.MethodDelete, PathDomains+"/"+url.PathEscape(name)+"/move", nil, &out)
	return out, err
}

// Routing is what DNS would publish for a domain.
func (c *Client) Routing(ctx context.Context, name string) (RoutingView, error) {
	var out RoutingView
	err := c.do(ctx, http.MethodGet, PathRouting+"/"+url.PathEscape(name), nil, &out)
	return out, err
}

// Domains lists the domains.
func (c *Client) Domains(ctx context.Context) ([]DomainView, error) {
	var out []DomainView
	err := c.do(ctx, http.MethodGet, PathDomains, nil, &out)
	return out, err
}

// Publish publishes a domain's next revision.
func (c *Client) Publish(ctx context.Context, name string, r DomainRequest) (PublishedView, error) {
	var out PublishedView
	err := c.do(ctx, http.MethodPut, PathDomains+"/"+url.PathEscape(name), r, &out)
	return out, err
}

// DeleteDomain withdraws a domain from every edge.
func (c *Client) DeleteDomain(ctx context.Context, name string) (PublishedView, error) {
	var out PublishedView
	err := c.do(ctx, http.MethodDelete, PathDomains+"/"+url.PathEscape(name), nil, &out)
	return out, err
}

// RollbackDomain republishes revision to of a domain, marked rollback.
func (c *Client) RollbackDomain(ctx context.Context, name string, to int64) (PublishedView, error) {
	var out PublishedView
	err := c.do(ctx, http.MethodPost, PathDomains+"/"+url.PathEscape(name)+"/rollback", RollbackRequest{To: to}, &out)
	return out, err
}

// RotateKey replaces the control plane's signing key.
func (c *Client) RotateKey(ctx context.Context) (RotatedView, error) {
	var out RotatedView
	err := c.do(ctx, http.MethodPost, PathKeys+"/rotate", struct{}{}, &out)
	return out, err
}
