package controlclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"cellvisor/edgeapi"
)

// ErrFenced is a fence the control API refused (409): the caller does not
// hold the lease at that epoch, or the peer is not a live edge of its org.
// The *FenceError carrying it says why.
var ErrFenced = errors.New("fence refused")

// FenceError is a refused fence, with the control API's reason and the
// current holder when it named one.
type FenceError struct {
	Refusal edgeapi.FenceRefusal
}

func (e *FenceError) Error() string {
	return fmt.Sprintf("%v: %s", ErrFenced, e.Refusal.Reason)
}

func (e *FenceError) Unwrap() error { return ErrFenced }

// Elect asks the control API who owns (this edge's org, class): the
// election cascade's answer, read leniently and bounded.
func (c *Client) Elect(ctx context.Context, r edgeapi.ElectRequest) (edgeapi.ElectResponse, error) {
	resp, err := c.do(ctx, c.o.Timeout, http.MethodPost, edgeapi.PathEgressElect, nil, nil, r)
	if err != nil {
		return edgeapi.ElectResponse{}, err
	}
	defer resp.Body.Close()
	var out edgeapi.ElectResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, edgeapi.MaxElectBytes)).Decode(&out); err != nil {
		return edgeapi.ElectResponse{}, fmt.Errorf("decode election answer: %w", err)
	}
	return out, nil
}

// Fence checks that this edge holds the (org, class) lease at r.Epoch (and,
// with r.Peer, that the peer is a live edge of its org): nil on 204, a
// *FenceError (errors.Is ErrFenced) on 409, any other failure as it is.
func (c *Client) Fence(ctx context.Context, r edgeapi.FenceRequest) error {
	resp, err := c.do(ctx, c.o.Timeout, http.MethodPost, edgeapi.PathEgressFence, nil, nil, r)
	var he *HTTPError
	if errors.As(err, &he) && he.Status == http.StatusConflict {
		// do read the body as an error message: a FenceRefusal when it
		// parses as one, else the message is the reason.
		var fr edgeapi.FenceRefusal
		if json.Unmarshal([]byte(he.Message), &fr) != nil || fr.Reason == "" {
			fr = edgeapi.FenceRefusal{Reason: he.Message}
		}
		return &FenceError{Refusal: fr}
	}
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return nil
}
