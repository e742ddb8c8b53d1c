// Package cellapi is the agent's client for a cell's private endpoint (a
// unix socket served by the cell's Lua): it signs every call with the cell's
// secret so that a call cannot be forged or replayed, and decodes the cell's
// status. Only supervisor and the demo (cmd/cellvisor-demo) import it.
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
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ErrUnauthorized is returned when the cell refuses a call's credentials.
var ErrUnauthorized = errors.New("cell refused the call's credentials")

// ErrExpired is returned when the cell took up a call only after its
// deadline or its timestamp's window had passed (a cell that was stalled):
// it did nothing with it, and did not count it as an attack.
var ErrExpired = errors.New("cell took up the call after its deadline")

// ErrAnswer marks a cell's answer other than 200, 401 and 408: the cell
// answered, and said no.
var ErrAnswer = errors.New("cell answered")

// ErrNoSuchCall is the cell's 404 to a call: a cell whose Lua predates the
// call (an older agent's release).
var ErrNoSuchCall = fmt.Errorf("%w: no such call", ErrAnswer)

// Answered reports whether err is the cell's own answer (a refusal, an
// expiry, another status), as opposed to a call that got no answer (a hung
// or stalled cell, a socket nobody accepts on).
func Answered(err error) bool {
	return errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrExpired) || errors.Is(err, ErrAnswer)
}

// Header names of the authentication scheme.
const (
	HeaderTime  = "X-Cellvisor-Time"
	HeaderNonce = "X-Cellvisor-Nonce"
	HeaderAuth  = "X-Cellvisor-Auth"
	// HeaderDeadline is the caller's deadline, unix milliseconds: a cell
	// that takes the call up later does nothing with it. It is not signed:
	// it can only make the cell refuse a call, never accept one.
	HeaderDeadline = "X-Cellvisor-Deadline"
)

// Status is a cell's own report of itself.
type Status struct {
	Cell     string `json:"cell"`
	Pool     string `json:"pool"`
	Sequence int64  `json:"sequence"`
	// Release is the release the cell serves (its directory's name), and
	// ConfRelease the one its running configuration was read from: they
	// differ once a newer release was loaded without a reload.
	Release     string `json:"release"`
	ConfRelease string `json:"conf_release"`
	// Shape is the running configuration's shape (runtime.ReleaseMeta.Shape):
	// a release of the same shape can be loaded; "" for a cell that cannot
	// load (an older agent's Lua).
	Shape string `json:"shape"`
	// WorkerPID is the worker that answered: the same across loads, a new
	// one after every reload.
	WorkerPID int `json:"worker_pid"`
	// LuaKB is the answering worker's Lua heap, in KiB: mostly the data it
	// serves (and, until collected, what a load replaced).
	LuaKB int64 `json:"lua_kb"`
	// Loads counts the releases the cell loaded without a reload, and
	// those it could not.
	Loads Loads `json:"loads"`
	// Cut counts requests the cell's workers ended unfinished when their
	// shutdown grace ran out (after a reload, or at a stop).
	Cut         Cut         `json:"cut"`
	Drained     bool        `json:"drained"`
	Listening   bool        `json:"listening"`
	Connections Connections `json:"connections"`
	Requests    int64       `json:"requests"`
	// Limits are the pool limits the cell enforces (zero: none); Refused
	// counts the requests they refused, by kind.
	Limits  Limits  `json:"limits"`
	Refused Refused `json:"refused"`
	// Cache counts the cache's answers to origin routes of cached domains.
	Cache Cache `json:"cache"`
	// Origins are keyed by domain/origin-name.
	Origins map[string]Origin `json:"origins"`
	// OriginServers are the passive health of origins' servers, keyed by
	// "domain/origin-name server-url": up (not skipped), failures, and
	// the retries they took.
	OriginServers map[string]OriginServer `json:"origin_servers"`
	Security      Security                `json:"security"`
	// Bodies is the cell's request-body budget (limits.request_tmp): what
	// the requests in progress hold, and the bodies refused past it.
	Bodies Bodies `json:"bodies"`
	// TLS is what the cell's HTTPS port presents and refuses.
	TLS TLS `json:"tls"`
}

// TLS is a cell's account of its HTTPS port.
type TLS struct {
	// Certificates are the certificates the cell presents, by domain.
	Certificates map[string]Certificate `json:"certificates"`
	// UnknownName and NoName count handshakes refused because the client
	// named a host the cell has no certificate for, or none.
	UnknownName int64 `json:"unknown_name"`
	NoName      int64 `json:"no_name"`
	// BadCertificate counts handshakes refused because the domain's
	// certificate or key did not parse (the cell's error log says which).
	BadCertificate int64 `json:"bad_certificate"`
	// Count and Soonest sum Certificates up (Summarize): what the agent
	// reports to the control API, which does not get the whole list.
	Count   int                 `json:"count,omitempty"`
	Soonest *SoonestCertificate `json:"soonest,omitempty"`
}

// SoonestCertificate is the certificate of a cell that expires first.
type SoonestCertificate struct {
	Domain   string `json:"domain"`
	NotAfter int64  `json:"not_after"`
}

// Summarize fills Count and Soonest from Certificates and drops the list.
func (t *TLS) Summarize() {
	t.Count, t.Soonest = len(t.Certificates), nil
	for d, c := range t.Certificates {
		if t.Soonest == nil || c.NotAfter < t.Soonest.NotAfter || c.NotAfter == t.Soonest.NotAfter && d < t.Soonest.Domain {
			t.Soonest = &SoonestCertificate{Domain: d, NotAfter: c.NotAfter}
		}
	}
	t.Certificates = nil
}

// Certificate is one certificate a cell presents.
type Certificate struct {
	// Fingerprint is the hex SHA-256 of the leaf certificate.
	Fingerprint string `json:"fingerprint"`
	// NotAfter is the leaf's expiry, in Unix seconds.
	NotAfter int64 `json:"not_after"`
}

// Bodies is the cell's account of request bodies against its budget.
type Bodies struct {
	// Held is the bytes the bodies of requests in progress may hold on
	// disk: their declared lengths, the whole per-request limit for a
	// chunked one.
	Held int64 `json:"held"`
	// Refused counts the bodies refused with 503 because admitting them
	// would have held more than the budget (limits.request_tmp).
	Refused int64 `json:"refused"`
}

// Loads are a cell's loads of releases without a reload.
type Loads struct {
	Count     int64  `json:"count"`
	Failures  int64  `json:"failures"`
	LastMs    int64  `json:"last_ms"`
	LastError string `json:"last_error"`
}

// Cut counts requests cut by the end of a worker's shutdown grace.
type Cut struct {
	Shutdown int64 `json:"shutdown"`
}

// Refusal is a cell's refusal to load a release: it keeps serving Release.
type Refusal struct {
	// Kind is RefusedReload, RefusedOlder or RefusedFailed.
	Kind    string `json:"error"`
	Reason  string `json:"reason"`
	Release string `json:"release"`
}

// The kinds of Refusal.
const (
	// RefusedReload: the release changes the configuration, not only its
	// data; a reload takes it.
	RefusedReload = "reload"
	// RefusedOlder: the release is not newer than the one served.
	RefusedOlder = "older"
	// RefusedFailed: the cell could not read or build the release's data.
	RefusedFailed = "failed"
)

func (r *Refusal) Error() string {
	return fmt.Sprintf("cell refused to load (%s): %s; serving %s", r.Kind, r.Reason, r.Release)
}

// Unwrap makes a refusal the cell's own answer (Answered).
func (r *Refusal) Unwrap() error { return ErrAnswer }

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

// Limits are a pool's per-cell limits as the cell enforces them.
type Limits struct {
	MaxConns int `json:"max_conns"`
	Rate     int `json:"rate"`
	Burst    int `json:"burst"`
}

// Refused counts requests the pool limits refused: over the connection
// limit (answered 503) and over the request rate (answered 429).
type Refused struct {
	Connections int64 `json:"connections"`
	Rate        int64 `json:"rate"`
}

// Cache counts $upstream_cache_status values of cached origin routes.
type Cache struct {
	Hit         int64 `json:"hit"`
	Miss        int64 `json:"miss"`
	Expired     int64 `json:"expired"`
	Bypass      int64 `json:"bypass"`
	Stale       int64 `json:"stale"`
	Updating    int64 `json:"updating"`
	Revalidated int64 `json:"revalidated"`
	// Full counts fresh answers served but not stored because the cache
	// was at its budget (limits.cache).
	Full int64 `json:"full"`
}

// Origin is a passive-origin failure summary: failures the cell saw while
// proxying to one origin.
type Origin struct {
	Failures      int64   `json:"failures"`
	LastFailureAt float64 `json:"last_failure_at"`
	LastStatus    int     `json:"last_status"`
	// Reasons counts the failures by reason (OriginReasons); LastReason is
	// the last one's ("resolve: ..." with the resolver's answer where the
	// origin's name did not resolve).
	Reasons    map[string]int64 `json:"reasons,omitempty"`
	LastReason string           `json:"last_reason,omitempty"`
}

// OriginServer is one origin server's passive health in a cell: down
// (skipped) for a while after 3 failures in a row.
type OriginServer struct {
	Up       bool  `json:"up"`
	Failures int64 `json:"failures"`
	Retries  int64 `json:"retries"`
	// Checks and CheckFailures count the origin's active health checks
	// of the server (health_check), LastCheckError says why the last one
	// failed ("" once one passes).
	Checks         int64  `json:"checks"`
	CheckFailures  int64  `json:"check_failures"`
	LastCheckError string `json:"last_check_error"`
}

// OriginReasons are the reasons a cell gives an origin's failure:
// connect_failed (refused, unreachable, or the TLS handshake failed),
// connect_timeout, resolve (its name did not resolve), read_timeout (no
// answer in time), reset (the connection closed without an answer),
// bad_answer (an answer nginx could not read), http_5xx (the origin's own
// 5xx).
var OriginReasons = []string{"connect_failed", "connect_timeout", "resolve", "read_timeout", "reset", "bad_answer", "http_5xx"}

// Security counts refused private calls.
type Security struct {
	AuthFailures int64   `json:"auth_failures"`
	LastAt       float64 `json:"last_at"`
	LastReason   string  `json:"last_reason"`
	// Expired counts correctly signed calls the cell took up only after
	// their deadline or timestamp window: the agent's own calls queued
	// while the cell was stalled. They are not security events.
	Expired int64 `json:"expired"`
}

// Client calls one cell's private endpoint, one call at a time. A call
// stays in flight until the cell answers it (or AbandonAfter), even when its
// caller gave up: a stalled cell gets one call queued on its socket, not one
// per status poll, and callers meanwhile wait, bounded by their contexts.
type Client struct {
	socket   string
	secret   []byte
	hc       *http.Client
	inflight chan struct{} // holds a token while a call is in flight
	base     context.Context
	stop     context.CancelFunc
}

// MaxFrontDoorURL is the longest URL FrontDoor sends to the cell: its
// private server reads request lines of up to 32 KiB, an escaped URL takes
// up to three times its length.
const MaxFrontDoorURL = 8 << 10

// MaxCallDeadline caps the deadline a call tells the cell: well inside the
// cell's timestamp window (runtime.DefaultAuthWindow, 30 s), so that the
// cell tells the agent's own late calls (past their deadline) from replays
// (outside the window).
const MaxCallDeadline = 10 * time.Second

// AbandonAfter bounds how long a call given up by its caller is still
// waited on for the cell's answer before another may be sent.
const AbandonAfter = time.Minute

// New returns a client for the cell listening on socket with secret.
func New(socket string, secret []byte) *Client {
	base, stop := context.WithCancel(context.Background())
	return &Client{socket: socket, secret: secret, inflight: make(chan struct{}, 1), base: base, stop: stop, hc: &http.Client{
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

// Close ends a call still in flight and releases idle connections.
func (c *Client) Close() {
	c.stop()
	c.hc.CloseIdleConnections()
}

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
	var st Status
	err := c.send(ctx, method, path, "", h, &st)
	return st, err
}

// send sends method path (with query, if not "") with the given headers
// and decodes the cell's 200 answer into out; any other answer is an error
// (ErrUnauthorized, ErrExpired, or the status with the cell's body).
func (c *Client) send(ctx context.Context, method, path, query string, h http.Header, out any) error {
	target := "http://cell" + path
	if query != "" {
		target += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, method, target, nil)
	if err != nil {
		return err
	}
	req.Header = h
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("cell %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("cell %s %s: %w: %s", method, path, ErrUnauthorized, body)
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("cell %s %s: %w", method, path, ErrNoSuchCall)
	case resp.StatusCode == http.StatusConflict:
		r := &Refusal{}
		if json.Unmarshal(body, r) != nil || r.Kind == "" {
			return fmt.Errorf("cell %s %s: %w %s: %s", method, path, ErrAnswer, resp.Status, body)
		}
		return fmt.Errorf("cell %s %s: %w", method, path, r)
	case resp.StatusCode == http.StatusRequestTimeout:
		return fmt.Errorf("cell %s %s: %w: %s", method, path, ErrExpired, body)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("cell %s %s: %w %s: %s", method, path, ErrAnswer, resp.Status, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("cell %s %s: decode: %w", method, path, err)
	}
	return nil
}

// call waits for the call in flight, if any, then signs and sends this one
// with ctx's deadline for the cell to see. If ctx ends first, the call stays
// in flight (holding the client) until the cell answers it or AbandonAfter.
func (c *Client) call(ctx context.Context, method, path string) (Status, error) {
	select {
	case c.inflight <- struct{}{}:
	case <-ctx.Done():
		return Status{}, fmt.Errorf("cell %s %s: an earlier call is still unanswered: %w", method, path, ctx.Err())
	}
	now := time.Now()
	h := c.Headers(method, path, now)
	// Every call carries a deadline well inside the cell's timestamp
	// window: a call the cell takes up late is then told by its deadline
	// as the agent's own (expired, not a security event), while a signed
	// call outside the window with a deadline not passed is a replay.
	d, ok := ctx.Deadline()
	if !ok || d.After(now.Add(MaxCallDeadline)) {
		d = now.Add(MaxCallDeadline)
	}
	h.Set(HeaderDeadline, strconv.FormatInt(d.UnixMilli(), 10))
	type result struct {
		st  Status
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-c.inflight }()
		rctx, cancel := context.WithTimeout(c.base, AbandonAfter)
		defer cancel()
		st, err := c.Do(rctx, method, path, h)
		done <- result{st, err}
	}()
	select {
	case r := <-done:
		return r.st, r.err
	case <-ctx.Done():
		return Status{}, fmt.Errorf("cell %s %s: no answer: %w", method, path, ctx.Err())
	}
}

// Status asks the cell for its status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodGet, "/status")
}

// Drain makes the cell stop advertising readiness.
func (c *Client) Drain(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, "/drain")
}

// Load makes the cell serve release id (a directory of its releases) as
// data, without a reload: it answers its status once the release is live.
// A cell that cannot load it keeps serving what it had and answers a
// *Refusal (errors.As) saying why.
func (c *Client) Load(ctx context.Context, id string) (Status, error) {
	if !validReleaseID(id) {
		return Status{}, fmt.Errorf("load %q: not a release name", id)
	}
	return c.call(ctx, http.MethodPost, "/load/"+id)
}

// validReleaseID is a release directory's name: digits, '-', hex.
func validReleaseID(id string) bool {
	seq, sum, ok := strings.Cut(id, "-")
	if !ok || seq == "" || sum == "" || len(id) > 64 {
		return false
	}
	for _, c := range seq {
		if c < '0' || c > '9' {
			return false
		}
	}
	for _, c := range sum {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Undrain makes the cell advertise readiness again.
func (c *Client) Undrain(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, "/undrain")
}

// FrontDoor asks the cell which edge fronts u (GET /frontdoor?url=U,
// resolved against its org's front doors): the edge's id, or the reason
// the cell refused (edge "").
func (c *Client) FrontDoor(ctx context.Context, u string) (edge, reason string, err error) {
	if len(u) > MaxFrontDoorURL {
		// Longer than any URL the resolver takes (2 KiB), and than the
		// cell's request line holds once escaped: refused here with the
		// resolver's own reason.
		return "", "malformed", nil
	}
	var out struct{ Edge, Reason string }
	err = c.send(ctx, http.MethodGet, "/frontdoor", "url="+url.QueryEscape(u), c.Headers(http.MethodGet, "/frontdoor", time.Now()), &out)
	return out.Edge, out.Reason, err
}
