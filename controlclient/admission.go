package controlclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"cellvisor/edgeapi"
	"cellvisor/internal/backoff"
)

// classOf names the request class of a path, as the control API admits
// them: a refusal of one class holds back that class only.
func classOf(path string) string {
	switch {
	case strings.HasPrefix(path, edgeapi.PathArtifacts):
		return edgeapi.PathArtifacts
	case strings.HasPrefix(path, edgeapi.PathTasks) && strings.HasSuffix(path, "/ack"):
		return edgeapi.PathTasks + "ack"
	case strings.HasPrefix(path, edgeapi.PathTasks):
		return edgeapi.PathTasks
	}
	return path
}

// retryAfter is the wait a 429 or 503 asks for: its Retry-After in
// seconds (an HTTP date is read too), within edgeapi.MaxRetryAfter;
// edgeapi.DefaultRetryAfter for a 429 without one; zero for anything else.
func retryAfter(resp *http.Response) time.Duration {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return 0
	}
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	var d time.Duration
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		d = time.Duration(min(n, int(edgeapi.MaxRetryAfter/time.Second))) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = time.Until(at)
	}
	if d <= 0 && resp.StatusCode == http.StatusTooManyRequests {
		d = edgeapi.DefaultRetryAfter
	}
	return min(max(d, 0), edgeapi.MaxRetryAfter)
}

// refused holds back a class the control API refused with a Retry-After:
// its next request waits that long plus up to half of it again, at random,
// so that the edges refused together do not come back together.
func (c *Client) refused(class string, err error) {
	var he *HTTPError
	if !errors.As(err, &he) || he.RetryAfter <= 0 {
		return
	}
	wait := he.RetryAfter + rand.N(he.RetryAfter/2+1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if at := c.o.Clock.Now().Add(wait); at.After(c.notBefore[class]) {
		c.notBefore[class] = at
	}
	c.log.Debug("request class refused by the control API; holding it back", zap.String("class", class),
		zap.Int("status", he.Status), zap.Duration("for", wait))
}

// waitAdmitted waits until class may be sent again, or ctx ends.
func (c *Client) waitAdmitted(ctx context.Context, class string) error {
	c.mu.Lock()
	at, ok := c.notBefore[class]
	if ok && !c.o.Clock.Now().Before(at) {
		delete(c.notBefore, class)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return nil
	}
	return backoff.Sleep(ctx, c.o.Clock, at.Sub(c.o.Clock.Now()))
}

// enrollTries bounds the sends of one enrollment refused 429 or 503.
const enrollTries = 4

// postEnroll sends an enrollment request, again (the same token and CSR:
// an exact retry, which gets the same answer) after each 429 or 503 with
// a Retry-After, waiting that long plus up to half again at random, at
// most enrollTries times; the last answer is returned as it is.
func postEnroll(ctx context.Context, hc *http.Client, url string, body []byte) (*http.Response, error) {
	for try := 1; ; try++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		wait := retryAfter(resp)
		if wait <= 0 || try == enrollTries {
			return resp, nil
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if err := backoff.Sleep(ctx, nil, wait+rand.N(wait/2+1)); err != nil {
			return nil, err
		}
	}
}
