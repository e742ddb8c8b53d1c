// Package agentmetrics owns the agent's Prometheus metrics: one collector
// that reads the supervisor's status, the cells' cgroup readings and private
// reports, and the activator's counters at scrape time, on a registry of its
// own, the agent process's Go runtime and process series, the text format
// they are written in (expo.go), and the HTTP endpoint that serves them.
// Only agent imports it.
package agentmetrics

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"cellvisor/activation"
	"cellvisor/supervisor"
)

const ns = "cellvisor"

// Options configures NewRegistry.
type Options struct {
	// Status reads the agent's status with each running cell's own report,
	// bounded by ctx. Required.
	Status func(ctx context.Context) supervisor.Status
	// Activation returns the activator's counters; nil when the agent has
	// no manifest source.
	Activation func() activation.Stats
	// LogBytes returns the bytes in a cell's logs directory, or nil to
	// leave the series out.
	LogBytes func(cell string) (int64, error)
	// ScrapeTimeout bounds one scrape's calls to the cells; zero means 2s.
	ScrapeTimeout time.Duration
	// Collectors are registered beside the agent's: the egress collector
	// (NewEgressCollector) and any that come later.
	Collectors []Collector
}

// States are the runtime states exported one gauge each.
var states = []supervisor.State{supervisor.StateReady, supervisor.StateDegraded, supervisor.StateDrained, supervisor.StateStopped, supervisor.StateWaiting}

// Enrollments are the enrollment states exported one gauge each (status
// says "not enrolled"; labels use underscores).
var enrollments = []string{"enrolled", "not_enrolled", "spool", "unusable", "standalone"}

// outcomes are the activation outcomes exported one gauge each.
var outcomes = []string{activation.OutcomeApplied, activation.OutcomePartial, activation.OutcomeRefused, activation.OutcomeFailed}

// Registry is the agent's own set of collectors (never a global one).
type Registry struct {
	cs []Collector
}

// NewRegistry returns a registry holding the agent's collector, its Go
// runtime and process collectors, and o.Collectors. Two collectors that
// describe the same family are refused.
func NewRegistry(o Options) (*Registry, error) {
	if o.ScrapeTimeout == 0 {
		o.ScrapeTimeout = 2 * time.Second
	}
	r := &Registry{cs: append([]Collector{newCollector(o), runtimeCollector{}, processCollector{}}, o.Collectors...)}
	seen := map[string]bool{}
	for _, c := range r.cs {
		for _, d := range c.Describe() {
			if seen[d.name] {
				return nil, fmt.Errorf("metric %s described twice", d.name)
			}
			seen[d.name] = true
		}
	}
	return r, nil
}

// Write collects every series and writes them in the text format.
func (r *Registry) Write(w io.Writer) error {
	var samples []sample
	emit := func(s sample) { samples = append(samples, s) }
	for _, c := range r.cs {
		c.Collect(emit)
	}
	return writeFamilies(w, samples)
}

// collector is the agent's own: every value is read when scraped, nothing
// is counted on the side.
type collector struct {
	o Options
}

var _ Collector = (*collector)(nil)

func newCollector(o Options) *collector { return &collector{o: o} }

// Describe lists every family this collector may send.
func (c *collector) Describe() []*Desc { return allDescs }

// Collect reads the status once and sends every series.
func (c *collector) Collect(emit func(sample)) {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.ScrapeTimeout)
	defer cancel()
	st := c.o.Status(ctx)
	c.collectAgent(emit, st)
	for _, s := range st.Slots {
		c.collectCell(emit, s)
	}
	if c.o.Activation != nil {
		collectActivation(emit, c.o.Activation())
	}
}

func (c *collector) collectAgent(emit func(sample), st supervisor.Status) {
	gauge(emit, agentInfo, 1, st.Version, string(st.CgroupMode))
	gauge(emit, limitsEnforced, b2f(st.Enforced))
	gauge(emit, startTime, float64(st.StartedAt.UnixNano())/1e9)
	enrollment := "standalone"
	if ctl := st.Control; ctl != nil {
		if ctl.Enrollment != "" {
			enrollment = strings.ReplaceAll(ctl.Enrollment, " ", "_")
		}
		gauge(emit, activeSequence, float64(ctl.ActiveSequence))
		gauge(emit, ackPending, float64(ctl.PendingAcks))
		counter(emit, ackDropped, float64(ctl.DroppedAcks))
		if ctl.LastSuccess != nil {
			gauge(emit, controlLastSuccess, unix(*ctl.LastSuccess))
		}
		if ctl.LastPoll != nil {
			gauge(emit, pollLast, unix(*ctl.LastPoll))
			gauge(emit, pollFailing, b2f(ctl.LastPollError != ""))
		}
		if ctl.CertExpires != nil {
			gauge(emit, certExpiry, unix(*ctl.CertExpires))
		}
		if fd := ctl.FrontDoors; fd != nil {
			gauge(emit, frontDoorRows, float64(fd.Rows))
			gauge(emit, frontDoorFailing, b2f(fd.Error != ""))
			if fd.LastFetch != nil {
				gauge(emit, frontDoorFetched, unix(*fd.LastFetch))
			}
		}
	}
	for _, e := range enrollments {
		gauge(emit, enrollmentState, b2f(e == enrollment), e)
	}
	if r := st.Runtime; r != nil {
		gauge(emit, runtimeInfo, 1, r.Version)
	}
}

func collectActivation(emit func(sample), s activation.Stats) {
	if !s.LastSuccess.IsZero() {
		gauge(emit, pollLastSuccess, unix(s.LastSuccess))
	}
	if !s.Last.At.IsZero() {
		gauge(emit, activationLastDuration, s.Last.Duration.Seconds())
		gauge(emit, activationLastTime, unix(s.Last.At))
		gauge(emit, activationLastSequence, float64(s.Last.Sequence))
	}
	for _, o := range outcomes {
		gauge(emit, activationLastOutcome, b2f(s.Last.Outcome == o), o)
		counter(emit, activations, float64(s.Outcomes[o]), o)
	}
	for _, r := range activation.RefusalClasses() {
		counter(emit, refusals, float64(s.Refusals[r]), r)
	}
}

func (c *collector) collectCell(emit func(sample), s supervisor.SlotStatus) {
	cell, pool := s.Name, s.Pool
	gauge(emit, cellInfo, 1, cell, pool, s.Assignment)
	for _, state := range states {
		gauge(emit, cellState, b2f(s.State == state), cell, pool, string(state))
	}
	gauge(emit, cellReady, b2f(s.State == supervisor.StateReady), cell, pool)
	gauge(emit, cellDrained, b2f(s.Drained), cell, pool)
	gauge(emit, cellUp, b2f(s.PID != 0), cell, pool)
	counter(emit, cellRestarts, float64(s.Restarts), cell, pool, "crash")
	counter(emit, cellRestarts, float64(s.OperatorRestarts), cell, pool, "operator")
	gauge(emit, cellSequence, float64(s.Sequence), cell, pool)
	if l := s.Liveness; l != nil {
		gauge(emit, cellOverloaded, b2f(l.Overloaded), cell, pool)
		counter(emit, cellOverloads, float64(l.Overloads), cell, pool)
	}
	if s.Limits.MemoryBytes > 0 {
		gauge(emit, cellMemoryLimit, float64(s.Limits.MemoryBytes), cell, pool)
	}
	if s.Limits.CPUPeriodUS > 0 && s.Limits.CPUQuotaUS > 0 {
		gauge(emit, cellCPULimit, float64(s.Limits.CPUQuotaUS)/float64(s.Limits.CPUPeriodUS), cell, pool)
	}
	if s.Limits.PIDs > 0 {
		gauge(emit, cellPIDsLimit, float64(s.Limits.PIDs), cell, pool)
	}
	if u := s.Usage; u != nil {
		gauge(emit, cellMemory, float64(u.MemoryBytes), cell, pool)
		counter(emit, cellCPU, float64(u.CPUUsageNS)/1e9, cell, pool)
		counter(emit, cellThrottled, float64(u.CPUThrottleNS)/1e9, cell, pool)
		counter(emit, cellThrottledPeriods, float64(u.CPUThrottled), cell, pool)
		gauge(emit, cellPIDs, float64(u.PIDs), cell, pool)
		counter(emit, cellOOM, float64(u.OOMKills), cell, pool)
		counter(emit, cellPIDsRefused, float64(u.PIDsRefused), cell, pool)
	}
	if c.o.LogBytes != nil {
		if n, err := c.o.LogBytes(cell); err == nil {
			gauge(emit, cellLogBytes, float64(n), cell, pool)
		}
	}
	counter(emit, cellReloads, float64(s.Reloads), cell, pool)
	if d := s.Disk; d != nil {
		for _, b := range []struct {
			name string
			b    supervisor.DiskBudget
		}{{"cache", d.Cache}, {"request_tmp", d.RequestTmp}, {"logs", d.Logs}} {
			gauge(emit, cellDisk, float64(b.b.Bytes), cell, pool, b.name)
			gauge(emit, cellDiskUnlinked, float64(b.b.Unlinked), cell, pool, b.name)
			gauge(emit, cellDiskBudget, float64(b.b.Budget), cell, pool, b.name)
		}
		counter(emit, cellCacheWakes, float64(d.CacheWakes), cell, pool)
	}
	if s.PID == 0 {
		return
	}
	if r := s.Runtime; r != nil {
		gauge(emit, cellRuntimeInfo, 1, cell, pool, r.Version)
		gauge(emit, cellSuperseded, b2f(r.Superseded), cell, pool)
	}
	gauge(emit, cellReportOK, b2f(s.Cell != nil), cell, pool)
	r := s.Cell
	if r == nil {
		return
	}
	for _, kv := range []struct {
		state string
		n     int
	}{{"active", r.Connections.Active}, {"reading", r.Connections.Reading}, {"writing", r.Connections.Writing}, {"waiting", r.Connections.Waiting}} {
		gauge(emit, cellConns, float64(kv.n), cell, pool, kv.state)
	}
	counter(emit, cellRequests, float64(r.Requests), cell, pool)
	counter(emit, cellLimited, float64(r.Refused.Connections), cell, pool, "connections")
	counter(emit, cellLimited, float64(r.Refused.Rate), cell, pool, "rate")
	byReason := map[string]int64{}
	for _, o := range r.Origins {
		given := int64(0)
		for reason, n := range o.Reasons {
			byReason[reason] += n
			given += n
		}
		byReason["unknown"] += max(o.Failures-given, 0)
	}
	for _, reason := range supervisor.OriginReasons {
		counter(emit, cellOriginFailures, float64(byReason[reason]), cell, pool, reason)
	}
	if n := byReason["unknown"]; n > 0 {
		counter(emit, cellOriginFailures, float64(n), cell, pool, "unknown")
	}
	counter(emit, cellSecurity, float64(r.Security.AuthFailures), cell, pool)
	counter(emit, cellLoads, float64(r.Loads.Count), cell, pool)
	counter(emit, cellLoadFailures, float64(r.Loads.Failures), cell, pool)
	counter(emit, cellCut, float64(r.Cut.Shutdown), cell, pool)
	gauge(emit, cellLuaHeap, float64(r.LuaKB)*1024, cell, pool)
	gauge(emit, cellBodiesHeld, float64(r.Bodies.Held), cell, pool)
	counter(emit, cellBodiesRefused, float64(r.Bodies.Refused), cell, pool)
	var down, retries, checks, checkFailures int64
	for _, sv := range r.OriginServers {
		if !sv.Up {
			down++
		}
		retries += sv.Retries
		checks += sv.Checks
		checkFailures += sv.CheckFailures
	}
	gauge(emit, cellOriginDown, float64(down), cell, pool)
	counter(emit, cellOriginRetries, float64(retries), cell, pool)
	counter(emit, cellOriginChecks, float64(checks-checkFailures), cell, pool, "passed")
	counter(emit, cellOriginChecks, float64(checkFailures), cell, pool, "failed")
	gauge(emit, cellCerts, float64(len(r.TLS.Certificates)), cell, pool)
	soonest := int64(0)
	for _, c := range r.TLS.Certificates {
		if soonest == 0 || c.NotAfter < soonest {
			soonest = c.NotAfter
		}
	}
	if soonest > 0 {
		gauge(emit, cellCertExpiry, float64(soonest), cell, pool)
	}
	counter(emit, cellTLSRefused, float64(r.TLS.UnknownName), cell, pool, "unknown_name")
	counter(emit, cellTLSRefused, float64(r.TLS.NoName), cell, pool, "no_name")
	counter(emit, cellTLSRefused, float64(r.TLS.BadCertificate), cell, pool, "bad_certificate")
}

func gauge(emit func(sample), d *Desc, v float64, labels ...string) {
	emit(sample{d: d, kind: gaugeKind, values: labels, v: v})
}

func counter(emit func(sample), d *Desc, v float64, labels ...string) {
	emit(sample{d: d, kind: counterKind, values: labels, v: v})
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
