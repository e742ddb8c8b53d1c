// Package cellapi is the agent's client for a cell's private endpoint (a
// unix socket served by the cell's Lua): it signs every call with the cell's
// secret so that a call cannot be forged or replayed, and decodes the cell's
// status. Only supervisor (and tests) import it.
package cellapi

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// ErrUnauthorized is returned when the cell refuses a call's credentials.
var ErrUnauthorized = errors.New("cell refused the call's credentials")

// Header names of the authentication scheme.
const (
	HeaderTime  = "X-Cellvisor-Time"
	HeaderNonce = "X-Cellvisor-Nonce"
	HeaderAuth  = "X-Cellvisor-Auth"
)

// Status is a cell's own report of itself.
type Status struct {
	Cell        string      `json:"cell"`
	Pool        string      `json:"pool"`
	Sequence    int64       `json:"sequence"`
	Drained     bool        `json:"drained"`
	Listening   bool        `json:"listening"`
	Connections Connections `json:"connections"`
	Requests    int64       `json:"requests"`
	// Origins are keyed by domain/origin-name.
	Origins  map[string]Origin `json:"origins"`
	Security Security          `json:"security"`
}

// Connections are the cell's client connections (nginx's stub status).
type Connections struct {
	Active  int `json:"active"`
	Reading int `json:"reading"`
	Writing int `json:"writing"`
	Waiting int `json:"waiting"`
}

// InFlight is the number of requests being served, not counting the status
// call asking.
func (c Connections) InFlight() int { return max(c.Reading+c.Writing-1, 0) }

// Origin is a passive-origin failure summary: failures the cell saw while
// proxying to one origin.
type Origin struct {
	Failures      int64   `json:"failures"`
	LastFailureAt float64 `json:"last_failure_at"`
	LastStatus    int     `json:"last_status"`
}

// Security counts refused private calls.
type Security struct {
	AuthFailures int64   `json:"auth_failures"`
	LastAt       float64 `json:"last_at"`
	LastReason   string  `json:"last_reason"`
}

// Client calls one cell's private endpoint.
type Client struct {
	socket string
	secret []byte
	hc     *http.Client
}

// New returns a client for the cell listening on socket with secret.
func New(socket string, secret []byte) *Client {
	return &Client{socket: socket, secret: secret, hc: &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", socket)
			},
			// A connection per call: every reload closes the old workers'
			// idle connections, and a POST is not retried on a stale one.
			// A unix-socket connect costs microseconds.
			DisableKeepAlives: true,
		},
	}}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Sign is the MAC of one call: HMAC-SHA1 (what every ngx_lua has built in)
// over method, path, timestamp and nonce.
func Sign(secret []byte, method, path, ts, nonce string) string {
	m := hmac.New(sha1.New, secret)
	io.WriteString(m, method+"\n"+path+"\n"+ts+"\n"+nonce)
	return hex.EncodeToString(m.Sum(nil))
}

// Headers returns fresh credentials for one call.
func (c *Client) Headers(method, path string, now time.Time) http.Header {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	ts, nonce := strconv.FormatInt(now.Unix(), 10), hex.EncodeToString(b)
	h := http.Header{}
	h.Set(HeaderTime, ts)
	h.Set(HeaderNonce, nonce)
	h.Set(HeaderAuth, Sign(c.secret, method, path, ts, nonce))
	return h
}

// Do sends method path with the given headers and decodes the status the
// cell answers with. Tests use it to send bad credentials.
func (c *Client) Do(ctx context.Context, method, path string, h http.Header) (Status, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://cell"+path, nil)
	if err != nil {
		return Status{}, err
	}
	req.Header = h
	resp, err := c.hc.Do(req)
	if err != nil {
		return Status{}, fmt.Errorf("cell %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Status{}, err
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return Status{}, fmt.Errorf("cell %s %s: %w: %s", method, path, ErrUnauthorized, body)
	case resp.StatusCode != http.StatusOK:
		return Status{}, fmt.Errorf("cell %s %s: %s: %s", method, path, resp.Status, body)
	}
	var st Status
	if err := json.Unmarshal(body, &st); err != nil {
		return Status{}, fmt.Errorf("cell %s %s: decode: %w", method, path, err)
	}
	return st, nil
}

func (c *Client) call(ctx context.Context, method, path string) (Status, error) {
	return c.Do(ctx, method, path, c.Headers(method, path, time.Now()))
}

// Status asks the cell for its status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodGet, "/status")
}

// Drain makes the cell stop advertising readiness.
func (c *Client) Drain(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, "/drain")
}

// Undrain makes the cell advertise readiness again.
func (c *Client) Undrain(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, "/undrain")
}
