package controlclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"cellvisor/edgeapi"
)

// ErrNotModified: the front doors are still those of the ETag given.
var ErrNotModified = errors.New("not modified")

// FrontDoors fetches the front doors of the edge's org: the raw answer (at
// most edgeapi.MaxFrontDoorsBytes, decoded by the caller) and its ETag.
// With etag, the last answer's, and nothing changed, it returns
// ErrNotModified and no body.
func (c *Client) FrontDoors(ctx context.Context, etag string) (body []byte, newETag string, err error) {
	h := http.Header{}
	if etag != "" {
		h.Set("If-None-Match", etag)
	}
	resp, err := c.do(ctx, c.o.Timeout, http.MethodGet, edgeapi.PathFrontDoors, nil, h, nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotModified {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, etag, ErrNotModified
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, edgeapi.MaxFrontDoorsBytes+1))
	if err != nil {
		return nil, "", fmt.Errorf("read front doors: %w", err)
	}
	if len(data) > edgeapi.MaxFrontDoorsBytes {
		return nil, "", fmt.Errorf("front doors: answer over %d bytes", edgeapi.MaxFrontDoorsBytes)
	}
	return data, resp.Header.Get("ETag"), nil
}
