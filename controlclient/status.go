package controlclient

import (
	"context"
	"strconv"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/edgeapi/statusdigest"
)

// statusMemo is the status report last sent, and the interval the
// control API assigned.
type statusMemo struct {
	digest   [32]byte
	at       time.Time // zero: none sent (or the last failed)
	interval time.Duration
}

// StatusInterval is the longest the agent goes without sending its status
// while nothing in it changed: the control API's word on its poll answers
// (edgeapi.HeaderStatusInterval), kept within edgeapi.MinStatusInterval–
// edgeapi.MaxStatusInterval, or edgeapi.DefaultStatusInterval until it
// gave one.
func (c *Client) StatusInterval() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statusIntervalLocked()
}

func (c *Client) statusIntervalLocked() time.Duration {
	if c.status.interval == 0 {
		return edgeapi.DefaultStatusInterval
	}
	return c.status.interval
}

// assignStatusInterval takes the interval a poll answer assigned, seconds,
// bounded; an answer without one (an older control API) changes nothing.
func (c *Client) assignStatusInterval(v string) {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return
	}
	d := min(max(time.Duration(n)*time.Second, edgeapi.MinStatusInterval), edgeapi.MaxStatusInterval)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status.interval = d
}

// ReportChanged sends r when it differs from the last report sent (its
// measurements and times aside: statusdigest) or when the status interval
// has passed since; otherwise it sends nothing: the poll is the heartbeat.
// sent reports whether r went out; a report that failed is sent again at
// the next call.
func (c *Client) ReportChanged(ctx context.Context, r edgeapi.StatusReport) (sent bool, err error) {
	digest, derr := statusdigest.Of(r.Status, r.Gateways)
	now := c.o.Clock.Now()
	c.mu.Lock()
	due := derr != nil || c.status.at.IsZero() || digest != c.status.digest || now.Sub(c.status.at) >= c.statusIntervalLocked()
	c.mu.Unlock()
	if !due {
		return false, nil
	}
	err = c.Report(ctx, r)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || derr != nil {
		c.status.at = time.Time{}
		return true, err
	}
	c.status.digest, c.status.at = digest, now
	return true, nil
}
