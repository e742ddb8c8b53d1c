package outbound

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"cellvisor/edgeapi"
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
	// Incarnation names the cell's running master (its pid and start
	// time): counters of another incarnation started again from 0. ""
	// where it cannot be told.
	Incarnation string
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
//
// The counters and the bundles made from them are not one write: the
// counters are persisted with the bundles they make (Pending) before the
// bundles are journaled, and without them after. A producer that finds
// pending bundles (its agent ended between the two writes) submits them
// again under their own ids: the journal ignores an id it holds, and the
// destination ingests by id, so a bundle delivered just before the agent
// ended is not counted twice, and one never journaled is not lost.
type counters struct {
	At      time.Time               `json:"at"`
	Cells   map[string]cellCounters `json:"cells"`
	Pending []edgeapi.Bundle        `json:"pending,omitempty"`
	// Prev are the counters before Pending's bundles: a class whose
	// pending bundle the journal refuses gets its own back, so that the
	// next bundle counts what it would have.
	Prev *counters `json:"prev,omitempty"`
}

type cellCounters struct {
	Requests     int64  `json:"requests"`
	AuthFailures int64  `json:"auth_failures"`
	Incarnation  string `json:"incarnation,omitempty"`
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
	// beforeSubmit, when set (tests), runs once Produce has persisted its
	// pending bundles, before it journals them.
	beforeSubmit func()
}

// NewProducer reads the counters a previous agent persisted in dir.
func NewProducer(s *Sender, dir string, sample func(context.Context) []CellSample) *Producer {
	p := &Producer{s: s, sample: sample, file: filepath.Join(dir, "counters.json"), log: s.log.Named("producer")}
	data, err := safefile.ReadFile(context.Background(), p.file, 1<<20)
	if err != nil || json.Unmarshal(data, &p.last) != nil || p.last.Cells == nil {
		p.last = counters{}
		return p
	}
	if len(p.last.Pending) > 0 {
		p.resubmit()
	}
	return p
}

// resubmit submits the bundles a previous producer persisted as pending,
// gives a refused one's class its previous counters back, and persists
// the outcome.
func (p *Producer) resubmit() {
	prev := p.last.Prev
	for _, b := range p.last.Pending {
		if err := p.s.Submit(b); err != nil {
			p.log.Error("pending bundle refused", zap.String("class", b.Class), zap.String("bundle", b.ID), zap.Error(err))
			if prev != nil {
				p.last = restore(p.last, *prev, egress.Class(b.Class))
			}
			continue
		}
		p.log.Info("pending bundle submitted again", zap.String("class", b.Class), zap.String("bundle", b.ID))
	}
	p.last.Pending, p.last.Prev = nil, nil
	p.persist(p.last)
}

// restore gives next class's counters from prev back.
func restore(next, prev counters, class egress.Class) counters {
	cells := make(map[string]cellCounters, len(next.Cells))
	for cell, c := range next.Cells {
		was := prev.Cells[cell]
		switch class {
		case egress.Metering:
			c.Requests = was.Requests
		case egress.SIEMForwarding:
			c.AuthFailures = was.AuthFailures
		}
		cells[cell] = c
	}
	next.Cells = cells
	if class == egress.Metering {
		next.At = prev.At // the metering interval goes on
	}
	return next
}

// persist writes c to the producer's file.
func (p *Producer) persist(c counters) {
	data, _ := json.Marshal(c)
	if err := atomicfile.WriteFile(p.file, data, 0o600); err != nil {
		p.log.Error("persist egress counters", zap.Error(err))
	}
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
	// A cell missing from this sample (not adopted yet after an agent
	// restart, its status call failed, stopped for a while) keeps its
	// counters: dropped, its next sample would count its whole lifetime
	// again.
	for cell, c := range p.last.Cells {
		next.Cells[cell] = c
	}
	var meter []Metering
	var events []SecurityEvent
	for _, c := range cells {
		cur := cellCounters{Requests: c.Requests, AuthFailures: c.AuthFailures, Incarnation: c.Incarnation}
		next.Cells[c.Cell] = cur
		if p.last.Cells == nil {
			continue
		}
		prev, seen := p.last.Cells[c.Cell]
		restarted := prev.Incarnation != "" && cur.Incarnation != "" && prev.Incarnation != cur.Incarnation
		if !seen || restarted {
			// A cell first seen, or restarted since: its counters
			// started from 0 (a restart's requests between the last
			// sample and the exit are the only ones not counted).
			prev = cellCounters{}
		}
		if d := delta(c.Requests, prev.Requests); d > 0 && p.s.Routes(string(egress.Metering)) {
			meter = append(meter, Metering{Cell: c.Cell, Pool: c.Pool, Requests: d, From: p.last.At, To: now})
		}
		if d := delta(c.AuthFailures, prev.AuthFailures); d > 0 && p.s.Routes(string(egress.SIEMForwarding)) {
			events = append(events, SecurityEvent{Cell: c.Cell, Kind: "auth_failure", Count: d, LastReason: c.LastReason, ObservedAt: now})
		}
	}
	// A class whose bundle cannot be built or is refused keeps its
	// previous counters, so that the next bundle counts what this one
	// would have.
	refused := map[egress.Class]bool{}
	var bundles []edgeapi.Bundle
	for _, c := range []struct {
		class egress.Class
		n     int
		items any
	}{{egress.Metering, len(meter), meter}, {egress.SIEMForwarding, len(events), events}} {
		if c.n == 0 {
			continue
		}
		b, err := NewBundle(p.s.o.Org, p.s.o.EdgeID, c.class, now, c.items)
		if err != nil {
			p.log.Error("bundle refused", zap.String("class", string(c.class)), zap.Error(fmt.Errorf("build %s bundle: %w", c.class, err)))
			refused[c.class] = true
			continue
		}
		bundles = append(bundles, b)
	}
	if len(bundles) > 0 {
		// The counters with the bundles they make, before the bundles are
		// journaled (see counters).
		pending, last := next, p.last
		pending.Pending, pending.Prev = bundles, &last
		p.persist(pending)
		if p.beforeSubmit != nil {
			p.beforeSubmit()
		}
	}
	for _, b := range bundles {
		if err := p.s.Submit(b); err != nil {
			p.log.Error("bundle refused", zap.String("class", b.Class), zap.Error(fmt.Errorf("submit %s bundle: %w", b.Class, err)))
			refused[egress.Class(b.Class)] = true
		}
	}
	if p.last.Cells != nil {
		for class := range refused {
			next = restore(next, p.last, class)
		}
	}
	p.persist(next)
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
