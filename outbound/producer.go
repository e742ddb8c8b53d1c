package outbound

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"cellvisor/egress"
	"cellvisor/internal/atomicfile"
	"cellvisor/internal/safefile"
)

// CellSample is one cell's counters as its status reports them: they only
// grow while the cell runs, and start again from 0 when it restarts.
type CellSample struct {
	Cell         string
	Pool         string
	Requests     int64
	AuthFailures int64
	LastReason   string
}

// Metering is a metering bundle's item: a cell's requests in the interval.
type Metering struct {
	Cell     string    `json:"cell"`
	Pool     string    `json:"pool,omitempty"`
	Requests int64     `json:"requests"`
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
}

// SecurityEvent is a siem_forwarding bundle's item: a cell's refused
// private calls in the interval.
type SecurityEvent struct {
	Cell       string    `json:"cell"`
	Kind       string    `json:"kind"` // "auth_failure"
	Count      int64     `json:"count"`
	LastReason string    `json:"last_reason,omitempty"`
	ObservedAt time.Time `json:"observed_at"`
}

// counters is what the producer last turned into bundles, persisted so
// that a restarted agent (whose cells kept running and counting) reports
// what they counted meanwhile.
type counters struct {
	At    time.Time               `json:"at"`
	Cells map[string]cellCounters `json:"cells"`
}

type cellCounters struct {
	Requests     int64 `json:"requests"`
	AuthFailures int64 `json:"auth_failures"`
}

// Producer turns the cells' counters into bundles every interval: request
// deltas as one metering bundle, auth-failure deltas as one siem_forwarding
// bundle, each only when non-zero.
type Producer struct {
	s      *Sender
	sample func(context.Context) []CellSample
	file   string
	log    *zap.Logger
	last   counters
}

// NewProducer reads the counters a previous agent persisted in dir.
func NewProducer(s *Sender, dir string, sample func(context.Context) []CellSample) *Producer {
	p := &Producer{s: s, sample: sample, file: filepath.Join(dir, "counters.json"), log: s.log.Named("producer")}
	data, err := safefile.ReadFile(context.Background(), p.file, 1<<20)
	if err == nil && json.Unmarshal(data, &p.last) == nil && p.last.Cells != nil {
		return p
	}
	p.last = counters{}
	return p
}

// Run produces every interval until ctx ends.
func (p *Producer) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		p.Produce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Produce takes one sample and submits its bundles. The first sample of
// an agent that has no persisted counters is a baseline.
func (p *Producer) Produce(ctx context.Context) {
	now := time.Now().UTC()
	cells := p.sample(ctx)
	if ctx.Err() != nil {
		return
	}
	next := counters{At: now, Cells: map[string]cellCounters{}}
	var meter []Metering
	var events []SecurityEvent
	for _, c := range cells {
		next.Cells[c.Cell] = cellCounters{Requests: c.Requests, AuthFailures: c.AuthFailures}
		if p.last.Cells == nil {
			continue
		}
		prev := p.last.Cells[c.Cell]
		if d := delta(c.Requests, prev.Requests); d > 0 && p.s.Routes(string(egress.Metering)) {
			meter = append(meter, Metering{Cell: c.Cell, Pool: c.Pool, Requests: d, From: p.last.At, To: now})
		}
		if d := delta(c.AuthFailures, prev.AuthFailures); d > 0 && p.s.Routes(string(egress.SIEMForwarding)) {
			events = append(events, SecurityEvent{Cell: c.Cell, Kind: "auth_failure", Count: d, LastReason: c.LastReason, ObservedAt: now})
		}
	}
	// A class whose bundle was refused keeps its previous counters, so that
	// the next bundle counts what this one would have.
	mOK, sOK := p.submit(egress.Metering, now, meter), p.submit(egress.SIEMForwarding, now, events)
	if p.last.Cells != nil && (!mOK || !sOK) {
		for cell, c := range next.Cells {
			prev := p.last.Cells[cell]
			if !mOK {
				c.Requests = prev.Requests
			}
			if !sOK {
				c.AuthFailures = prev.AuthFailures
			}
			next.Cells[cell] = c
		}
		if !mOK {
			next.At = p.last.At // the metering interval goes on
		}
	}
	data, _ := json.Marshal(next)
	if err := atomicfile.WriteFile(p.file, data, 0o600); err != nil {
		p.log.Error("persist egress counters", zap.Error(err))
	}
	p.last = next
}

// delta is what a counter counted since prev; a smaller value is a cell
// that restarted and counts from 0.
func delta(now, prev int64) int64 {
	if now < prev {
		return now
	}
	return now - prev
}

func (p *Producer) submit(class egress.Class, now time.Time, items any) bool {
	switch v := items.(type) {
	case []Metering:
		if len(v) == 0 {
			return true
		}
	case []SecurityEvent:
		if len(v) == 0 {
			return true
		}
	}
	b, err := NewBundle(p.s.o.Org, p.s.o.EdgeID, class, now, items)
	if err == nil {
		err = p.s.Submit(b)
	}
	if err != nil {
		p.log.Error("bundle refused", zap.String("class", string(class)), zap.Error(fmt.Errorf("submit %s bundle: %w", class, err)))
		return false
	}
	return true
}
