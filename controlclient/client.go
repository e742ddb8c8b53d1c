package controlclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/edgeapi"
	"cellvisor/internal/clock"
	"cellvisor/manifest"
)

// Files in an identity directory.
const (
	KeyFile      = "key.pem"
	CertFile     = "cert.pem"
	CAFile       = "ca.pem"
	ServerCAFile = "server-ca.pem"
)

// HTTPError is a refusal or failure answered by the control API.
type HTTPError struct {
	Status  int
	Message string
	// RetryAfter is the wait a 429 or 503 asked for (Retry-After), within
	// edgeapi.MaxRetryAfter; edgeapi.DefaultRetryAfter for a 429 that
	// named none; zero otherwise.
	RetryAfter time.Duration
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("control API: %s (HTTP %d)", e.Message, e.Status)
}

// Retryable reports a failure worth retrying as it is: 410 (a manifest
// superseded mid-walk), 429 and 5xx.
func (e *HTTPError) Retryable() bool {
	return e.Status == http.StatusGone || e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// Permanent reports that the control API refused the request itself (400,
// 413, 422): sending it again can only be refused again. An identity
// refused (401) is not permanent: a re-enrollment fixes it.
func (e *HTTPError) Permanent() bool {
	return e.Status == http.StatusBadRequest || e.Status == http.StatusRequestEntityTooLarge || e.Status == http.StatusUnprocessableEntity
}

// Options configure a Client.
type Options struct {
	// URL is the edge-control API's base URL (https://…). Required.
	URL string
	// Dir is the identity directory enrollment wrote. Required.
	Dir string
	// Timeout bounds one request, its answer read; zero means 30s. The
	// recovery snapshot gets SnapshotTimeout.
	Timeout time.Duration
	// LongPoll is how long the control API may hold a poll while nothing
	// is new (edgeapi.QueryWait), at most edgeapi.MaxWait; zero polls
	// plainly. Such a poll's bound is Timeout plus LongPoll.
	LongPoll time.Duration
	// Logger, or nil for none.
	Logger *zap.Logger
	// Clock times the waits a refusal asks for (Retry-After) and the
	// status interval, or nil for the real clock.
	Clock clock.Clock
}

// Client is the agent's mutual-TLS client of the edge-control API: a
// manifest.Source, plus tasks and status reports. It reloads its
// certificate when the files change (a re-enrollment after a rotation),
// and renews it (RunRenewal).
type Client struct {
	o     Options
	base  *url.URL
	roots *x509.CertPool
	log   *zap.Logger

	tasks chan struct{} // signalled when a poll says tasks are pending

	mu        sync.Mutex // guards the following fields
	hc        *http.Client
	hcGen     int // bumped when a renewed certificate replaces hc
	cert      *tls.Certificate
	certMod   time.Time
	switching bool // a renewal is writing the files: no reload until install
	lastOK    time.Time
	lastFail  error
	renewal   renewState
	// notBefore is, per request class (see classOf), when the control
	// API's Retry-After lets it be sent again.
	notBefore map[string]time.Time
	status    statusMemo
}

var _ manifest.Source = (*Client)(nil)

// New prepares a client from an identity directory.
func New(o Options) (*Client, error) {
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	base, err := url.Parse(o.URL)
	if err != nil || base.Scheme != "https" || base.Host == "" {
		return nil, fmt.Errorf("control URL %q: want https://host:port", o.URL)
	}
	roots, err := serverRoots(o.Dir)
	if err != nil {
		return nil, err
	}
	o.Clock = clock.Or(o.Clock)
	c := &Client{o: o, base: base, roots: roots, log: o.Logger.Named("control"), tasks: make(chan struct{}, 1), notBefore: map[string]time.Time{}}
	if _, err := c.clientCert(nil); err != nil {
		return nil, err
	}
	c.hc = c.newHTTPClient()
	return c, nil
}

// newHTTPClient is a client with its own connections: a renewed
// certificate gets new ones, as the old ones stay authenticated by the
// certificate they were opened with.
func (c *Client) newHTTPClient() *http.Client {
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: c.roots, GetClientCertificate: c.clientCert},
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	return &http.Client{Transport: tr}
}

// httpClient is the client to send with, and its generation.
func (c *Client) httpClient() (*http.Client, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hc, c.hcGen
}

// serverRoots is what the edge trusts for the control API: the CA file it
// enrolled with, or the system's roots when it enrolled without one.
func serverRoots(dir string) (*x509.CertPool, error) {
	data, err := os.ReadFile(filepath.Join(dir, ServerCAFile))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("server CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("server CA %s: no PEM certificate", filepath.Join(dir, ServerCAFile))
	}
	return pool, nil
}

// clientCert loads the certificate, again when its file changed (see
// loadPair).
func (c *Client) clientCert(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	certPath := filepath.Join(c.o.Dir, CertFile)
	st, err := os.Stat(certPath)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w (enroll this edge first)", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && (st.ModTime().Equal(c.certMod) || c.switching) {
		return c.cert, nil
	}
	cert, err := loadPair(c.o.Dir)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	c.cert, c.certMod = &cert, st.ModTime()
	return c.cert, nil
}

// Tasks is signalled when a poll says control tasks are pending.
func (c *Client) TasksPending() <-chan struct{} { return c.tasks }

// LastSuccess is when the control API last answered, and the last failure
// to reach it since (nil once it answers again).
func (c *Client) LastSuccess() (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastOK, c.lastFail
}

func (c *Client) record(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var he *HTTPError
	if err == nil || errors.As(err, &he) && !he.Retryable() {
		c.lastOK, c.lastFail = time.Now(), nil
		return
	}
	c.lastFail = err
}

// SnapshotTimeout bounds the download of a recovery snapshot (up to
// manifest.SnapshotLimit bytes) asked for without a deadline; a poll's
// deadline (source.poll_timeout) bounds it instead when there is one.
const SnapshotTimeout = 10 * time.Minute

// cancelBody ends a request's deadline when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// do sends a request, bounded by timeout until its body is closed, and
// returns the response for the caller to close; a status of 300 and over
// but 304 is an *HTTPError.
func (c *Client) do(ctx context.Context, timeout time.Duration, method, path string, query url.Values, header http.Header, body any) (*http.Response, error) {
	u := *c.base
	u.Path = strings.TrimRight(u.Path, "/") + path
	u.RawQuery = query.Encode()
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	class := classOf(path)
	if err := c.waitAdmitted(ctx, class); err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	resp, retry, err := c.send(ctx, timeout, method, u.String(), header, data)
	if retry {
		// Refused with the certificate a renewal replaced while the request
		// was on its way: sent again on the renewed one's connections.
		if resp, retry, err = c.send(ctx, timeout, method, u.String(), header, data); retry {
			err = &HTTPError{Status: http.StatusUnauthorized, Message: "refused twice while the client certificate was being renewed"}
		}
	}
	if err != nil {
		err = fmt.Errorf("%s %s: %w", method, path, err)
		c.record(err)
		return nil, err
	}
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusNotModified {
		err := readError(resp)
		resp.Body.Close()
		c.refused(class, err)
		if resp.StatusCode == http.StatusUnauthorized {
			// Refused identity (rotated): the next request handshakes again,
			// with the certificate a re-enrollment may have written meanwhile.
			c.CloseIdle()
		}
		c.record(err)
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	c.record(nil)
	return resp, nil
}

// send sends one request; retry reports a 401 answered on the connections
// of a certificate renewed since (the body is then closed).
func (c *Client) send(ctx context.Context, timeout time.Duration, method, u string, header http.Header, data []byte) (_ *http.Response, retry bool, _ error) {
	var rd io.Reader
	if data != nil {
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		cancel()
		return nil, false, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if data != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc, gen := c.httpClient()
	resp, err := hc.Do(req)
	if err != nil {
		cancel()
		return nil, false, err
	}
	resp.Body = cancelBody{resp.Body, cancel}
	if resp.StatusCode == http.StatusUnauthorized {
		if _, now := c.httpClient(); now != gen {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			return nil, true, nil
		}
	}
	return resp, false, nil
}

// readError reads an error body leniently (edgeapi.ErrorBody: unknown
// fields ignored, or plain text), at most 64 KiB of it, and keeps a message
// cut and escaped as a refusal reason is: it ends up in logs and status.
func readError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e edgeapi.ErrorBody
	if json.Unmarshal(data, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(data))
	}
	return &HTTPError{Status: resp.StatusCode, Message: manifest.CutReason(e.Error), RetryAfter: retryAfter(resp)}
}

// Page asks for a page of the newest manifest after sequence after: a
// conditional request that the control API answers with no body when there
// is none, after holding it up to Options.LongPoll.
func (c *Client) Page(ctx context.Context, after int64, cursor string) (manifest.Page, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}}
	h := http.Header{}
	timeout := c.o.Timeout
	if cursor != "" {
		q.Set("cursor", cursor)
	} else {
		h.Set("If-None-Match", `"`+strconv.FormatInt(after, 10)+`"`)
		if wait := min(c.o.LongPoll, edgeapi.MaxWait); wait >= time.Second {
			q.Set(edgeapi.QueryWait, strconv.Itoa(int(wait.Seconds())))
			timeout += wait
		}
	}
	resp, err := c.do(ctx, timeout, http.MethodGet, edgeapi.PathManifest, q, h, nil)
	if err != nil {
		return manifest.Page{}, err
	}
	defer resp.Body.Close()
	c.assignStatusInterval(resp.Header.Get(edgeapi.HeaderStatusInterval))
	if n, _ := strconv.Atoi(resp.Header.Get(edgeapi.HeaderTasks)); n > 0 {
		select {
		case c.tasks <- struct{}{}:
		default:
		}
	}
	if resp.StatusCode == http.StatusNotModified || resp.StatusCode == http.StatusNoContent {
		io.Copy(io.Discard, resp.Body)
		return manifest.Page{}, manifest.ErrNoChange
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, manifest.MaxPageBytes+1))
	if err != nil {
		return manifest.Page{}, fmt.Errorf("read manifest page: %w", err)
	}
	return manifest.ParsePage(data) // Collect validates, and refuses naming the sequence
}

// Artifact fetches an artifact's bytes, at most manifest.MaxArtifactBytes.
func (c *Client) Artifact(ctx context.Context, sha256 string) ([]byte, error) {
	if len(sha256) != 64 {
		return nil, fmt.Errorf("%w: artifact name %q", manifest.ErrInvalid, sha256)
	}
	resp, err := c.do(ctx, c.o.Timeout, http.MethodGet, edgeapi.PathArtifacts+sha256, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, manifest.MaxArtifactBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read artifact %s: %w", sha256, err)
	}
	if len(data) > manifest.MaxArtifactBytes {
		return nil, fmt.Errorf("%w: artifact %s over %d bytes", manifest.ErrSize, sha256, manifest.MaxArtifactBytes)
	}
	return data, nil
}

// Ack delivers an acknowledgement. One with runtimes that the control
// API refuses (400: a control API older than them decodes acks strictly)
// is sent again without them: what was applied is what matters.
func (c *Client) Ack(ctx context.Context, a manifest.Ack) error {
	resp, err := c.do(ctx, c.o.Timeout, http.MethodPost, edgeapi.PathAcks, nil, nil, a)
	var he *HTTPError
	if len(a.Runtimes) > 0 && errors.As(err, &he) && he.Status == http.StatusBadRequest {
		c.log.Warn("ack refused with the cells' runtimes; sending it without them", zap.Int64("sequence", a.Sequence), zap.Error(err))
		a.Runtimes = nil
		resp, err = c.do(ctx, c.o.Timeout, http.MethodPost, edgeapi.PathAcks, nil, nil, a)
	}
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Snapshot opens the recovery snapshot; the reader is bounded by
// manifest.ReadSnapshot. ErrNoChange when the edge has no manifest yet, or
// one too big for a snapshot (the activation then pages through it); an
// error wrapping manifest.ErrSnapshotBusy (and the *HTTPError) when the
// control API will not serve it now, 503 or 429 (the activation pages).
func (c *Client) Snapshot(ctx context.Context) (io.ReadCloser, error) {
	timeout := SnapshotTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl) // the poll's, which may be longer
	}
	resp, err := c.do(ctx, timeout, http.MethodGet, edgeapi.PathSnapshot, nil, nil, nil)
	var he *HTTPError
	if errors.As(err, &he) && he.Status == http.StatusNotFound {
		return nil, manifest.ErrNoChange
	}
	if errors.As(err, &he) && he.Status == http.StatusInsufficientStorage {
		// Too big for one snapshot: page through the manifest instead.
		c.log.Info("recovery snapshot over its bound; paging the manifest", zap.Error(err))
		return nil, manifest.ErrNoChange
	}
	if errors.As(err, &he) && (he.Status == http.StatusServiceUnavailable || he.Status == http.StatusTooManyRequests) {
		return nil, fmt.Errorf("%w: %w", manifest.ErrSnapshotBusy, err)
	}
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Tasks returns the edge's pending control tasks, decoded leniently (see
// edgeapi): a newer control API may add fields.
func (c *Client) Tasks(ctx context.Context) ([]edgeapi.Task, error) {
	resp, err := c.do(ctx, c.o.Timeout, http.MethodGet, edgeapi.PathTasks, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []edgeapi.Task
	if err := json.NewDecoder(io.LimitReader(resp.Body, edgeapi.MaxTasksBytes)).Decode(&out); err != nil {
		return nil, fmt.Errorf("decode tasks: %w", err)
	}
	return out, nil
}

// AckTask reports what became of a task.
func (c *Client) AckTask(ctx context.Context, id int64, a edgeapi.TaskAck) error {
	resp, err := c.do(ctx, c.o.Timeout, http.MethodPost, edgeapi.PathTasks+strconv.FormatInt(id, 10)+"/ack", nil, nil, a)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Report sends a status report.
func (c *Client) Report(ctx context.Context, r edgeapi.StatusReport) error {
	resp, err := c.do(ctx, c.o.Timeout, http.MethodPost, edgeapi.PathStatus, nil, nil, r)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// CloseIdle closes idle connections.
func (c *Client) CloseIdle() {
	hc, _ := c.httpClient()
	hc.CloseIdleConnections()
}
