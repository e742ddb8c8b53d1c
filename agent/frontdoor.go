package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/frontdoor"
	"cellvisor/internal/atomicfile"
	"cellvisor/internal/backoff"
	"cellvisor/supervisor"
)

// FrontDoorFileName is the runtime file, in the state directory, of the
// org's front doors: what the cells' Lua resolver (lua/frontdoor.lua)
// reads. The agent replaces it atomically; the cells re-read it when it
// changes.
const FrontDoorFileName = "frontdoors.json"

// FrontDoorFile is the front-door runtime file's path.
func FrontDoorFile(stateDir string) string { return filepath.Join(stateDir, FrontDoorFileName) }

// frontDoors is the state of the front-door fetch, for status.
type frontDoors struct {
	mu sync.Mutex // guards the following fields
	// etag is the ETag of the answer the file holds.
	etag    string
	rows    int
	fetched time.Time
	err     string
}

// frontDoorLoop keeps the runtime file equal to the control API's front
// doors of the edge's org, asking every status interval (a 304 when
// nothing changed). An answer it cannot use (over its bound, undecodable,
// a corrupt row) is refused: the file keeps the last good rows, and the
// log and status say why.
func (a *Agent) frontDoorLoop(ctx context.Context) {
	every := a.cfg.Source.StatusInterval.D()
	b := &backoff.Backoff{Initial: every, Max: a.cfg.Source.MaxBackoff.D()}
	for {
		err := a.fetchFrontDoors(ctx)
		if ctx.Err() != nil {
			return
		}
		delay := b.Steady()
		if err != nil {
			delay = b.Next()
			a.log.Warn("front doors", zap.Duration("retry_in", delay), zap.Error(err))
		} else {
			b.Reset()
		}
		if backoff.Sleep(ctx, nil, delay) != nil {
			return
		}
	}
}

func (a *Agent) fetchFrontDoors(ctx context.Context) error {
	a.fd.mu.Lock()
	etag := a.fd.etag
	a.fd.mu.Unlock()
	body, tag, err := a.client.FrontDoors(ctx, etag)
	if errors.Is(err, controlclient.ErrNotModified) {
		a.setFrontDoors(etag, -1, nil)
		return nil
	}
	if err == nil {
		var n int
		if n, err = writeFrontDoors(FrontDoorFile(a.cfg.StateDir), body); err == nil {
			a.log.Info("front doors updated", zap.Int("rows", n))
			a.setFrontDoors(tag, n, nil)
			return nil
		}
	}
	a.setFrontDoors(etag, -1, err)
	return err
}

func (a *Agent) setFrontDoors(etag string, rows int, err error) {
	a.fd.mu.Lock()
	defer a.fd.mu.Unlock()
	a.fd.etag = etag
	if rows >= 0 {
		a.fd.rows = rows
	}
	if err != nil {
		a.fd.err = err.Error()
		return
	}
	a.fd.err, a.fd.fetched = "", time.Now()
}

// writeFrontDoors checks an answer (read leniently, every row canonical by
// the resolver's rules) and writes the rows the cells read; it returns
// their count. A refused answer leaves the file as it was.
func writeFrontDoors(path string, body []byte) (int, error) {
	var fd edgeapi.FrontDoors
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&fd); err != nil {
		return 0, fmt.Errorf("front doors refused: decode: %w", err)
	}
	for i, r := range fd.Rows {
		if err := frontdoor.CheckRow(frontdoor.Row{Edge: r.Edge, URL: r.URL}); err != nil {
			return 0, fmt.Errorf("front doors refused: row %d: %w", i+1, err)
		}
	}
	if fd.Rows == nil {
		fd.Rows = []edgeapi.FrontDoorRow{}
	}
	data, err := json.Marshal(fd)
	if err != nil {
		return 0, err
	}
	if err := atomicfile.WriteFile(path, data, 0o644); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	return len(fd.Rows), nil
}

// frontDoorStatus is the fetch's state for status.
func (a *Agent) frontDoorStatus() *supervisor.FrontDoorStatus {
	a.fd.mu.Lock()
	defer a.fd.mu.Unlock()
	st := &supervisor.FrontDoorStatus{Rows: a.fd.rows, Error: a.fd.err}
	if !a.fd.fetched.IsZero() {
		t := a.fd.fetched
		st.LastFetch = &t
	}
	return st
}

// gateways are the edge's public service groups for its status report:
// the cells' HTTP and HTTPS listeners, healthy while an assigned cell is
// ready, with the configured topology and the last measured round trip to
// the control API.
func (a *Agent) gateways(st supervisor.Status) []edgeapi.Gateway {
	http := edgeapi.Gateway{Service: "http", Protocol: "http", Host: a.cfg.Ports.Address, Port: a.cfg.Ports.HTTPBase}
	https := edgeapi.Gateway{Service: "https", Protocol: "https", Host: a.cfg.Ports.Address, Port: a.cfg.Ports.HTTPSBase, TLS: true}
	for _, s := range st.Slots {
		if s.Pool != "" && s.State == supervisor.StateReady {
			http.Healthy, https.Healthy = true, true
		}
	}
	out := []edgeapi.Gateway{http, https}
	for i := range out {
		g := &out[i]
		g.Region, g.Zone, g.Locality = a.cfg.Topology.Region, a.cfg.Topology.Zone, a.cfg.Topology.Locality
		g.RTTMicros = a.rtt.Load()
	}
	return out
}
