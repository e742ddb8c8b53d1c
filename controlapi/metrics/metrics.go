// Package metrics owns the control API's Prometheus series
// (cellvisor_control_*): their names, labels and buckets, on a registry of
// their own, and the handler that serves them. controlapi records into it
// and serves it on the admin listener; docs/observability.md lists every
// series. Only controlapi imports it.
package metrics

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"cellvisor/internal/connlimit"
)

// Listener names, the listener label's values.
const (
	Edge  = "edge"
	Admin = "admin"
)

// Poll results.
const (
	PollNotModified = "not_modified"
	PollManifest    = "manifest"
)

// Status report results.
const (
	StatusWritten   = "written"
	StatusUnchanged = "unchanged"
)

// SilentAges are the lower bounds (seconds) of the last-seen age bands of
// cellvisor_control_edges_by_last_seen; an edge is counted in the band of
// the largest bound its age reaches.
var SilentAges = []time.Duration{0, time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour}

// EdgeSeen is one edge as the fleet collector reports it.
type EdgeSeen struct {
	ID       string
	Enrolled bool
	// LastSeen is zero for never.
	LastSeen time.Time
}

// LeaseHolder is one egress lease held: the edge holding it for (org,
// traffic class), its fencing epoch and when it expires unless renewed.
type LeaseHolder struct {
	Org, Class, Edge string
	Epoch            int64
	Expires          time.Time
}

// Pools is the placement state the pool series are read from.
type Pools struct {
	// Pools lists every pool with its settings and domains.
	Pools []Pool
	// Ready lists, for each edge that reported its status, its ready cells
	// in each pool it has cells in.
	Ready []PoolReady
}

// Pool is one pool: its minimum of ready cells per edge and the domains
// whose active pool it is.
type Pool struct {
	Name     string
	MinReady int
	Domains  int
}

// PoolReady is one edge's ready cells in one pool, from its latest status
// report: running, ready and not drained.
type PoolReady struct {
	Edge, Pool string
	Ready      int
}

// Options configure Metrics.
type Options struct {
	// Fleet lists every edge with its last-seen time at scrape time;
	// required.
	Fleet func(ctx context.Context) ([]EdgeSeen, error)
	// Leases lists the egress leases held at scrape time, or nil until
	// egress exists (no lease series then).
	Leases func(ctx context.Context) ([]LeaseHolder, error)
	// Pools reads the pools and each edge's ready cells per pool at
	// scrape time, or nil for no pool series.
	Pools func(ctx context.Context) (Pools, error)
	// ScrapeTimeout bounds Fleet, Leases and Pools together; zero means 10s.
	ScrapeTimeout time.Duration
	// Now is the clock, or nil for time.Now.
	Now func() time.Time
	// Logger, or nil for none.
	Logger *zap.Logger
}

// Metrics are the control API's series.
type Metrics struct {
	o   Options
	reg *prometheus.Registry

	requests    *prometheus.HistogramVec
	polls       *prometheus.CounterVec
	enrollments *prometheus.CounterVec
	acks        *prometheus.CounterVec
	statuses    *prometheus.CounterVec
	publish     prometheus.Histogram
	builds      *prometheus.HistogramVec
	batches     prometheus.Histogram
	held        prometheus.Gauge
	placement   prometheus.Histogram
	writes      *prometheus.CounterVec
	retries     prometheus.Counter
	seenRows    prometheus.Counter
	refused     *prometheus.CounterVec

	mu        sync.Mutex // guards listeners
	listeners map[string]func() connlimit.Stats
}

// New registers the series, the Go runtime's and the process's on a new
// registry.
func New(o Options) *Metrics {
	if o.ScrapeTimeout <= 0 {
		o.ScrapeTimeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	m := &Metrics{o: o, reg: prometheus.NewRegistry(), listeners: map[string]func() connlimit.Stats{}}
	m.requests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "cellvisor_control_http_request_duration_seconds",
		Help: "HTTP requests by listener, route (the mux pattern, never the raw path) and status code: latency; _count counts requests.",
		// 100 µs (a cached poll) to 10 s (a snapshot download).
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
	}, []string{"listener", "route", "code"})
	m.polls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cellvisor_control_polls_total",
		Help: "Manifest polls answered, by result: not_modified (304/204, from the cache) or manifest (200, a page).",
	}, []string{"result"})
	m.enrollments = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cellvisor_control_enrollments_total",
		Help: "Enrollment requests by outcome: enrolled, retried (the same token and CSR again), refused or failed.",
	}, []string{"outcome"})
	m.acks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cellvisor_control_acks_total",
		Help: "Manifest acknowledgements by outcome: applied, partial, refused, or invalid (rejected with 400).",
	}, []string{"outcome"})
	m.statuses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cellvisor_control_status_reports_total",
		Help: "Status reports taken, by result: written to the database, or unchanged (same content, not written).",
	}, []string{"result"})
	m.publish = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "cellvisor_control_publish_duration_seconds",
		Help:    "Publishing a domain revision: its placement where the pool lacks it and its fan-out (each edge's manifest is built at its next poll).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12), // 1 ms to about 24 s
	})
	m.builds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cellvisor_control_manifest_builds_seconds",
		Help:    "Building an edge's manifest past the fan-outs that concern it, at its poll, by result: advanced (a new sequence signed) or unchanged.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12), // 100 µs to about 2.4 s
	}, []string{"result"})
	m.batches = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "cellvisor_control_db_batch_writes",
		Help:    "Writes (acks, status reports) each group-committed transaction carried.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10), // 1 to 512
	})
	m.held = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cellvisor_control_polls_held",
		Help: "Manifest polls held now (long polls waiting for a new manifest or a task).",
	})
	m.placement = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "cellvisor_control_placement_duration_seconds",
		Help:    "Placing one domain on one edge's pool (reading its cells and placements, choosing).",
		Buckets: prometheus.ExponentialBuckets(0.00005, 2.5, 10), // 50 µs to about 190 ms
	})
	m.writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cellvisor_control_db_writes_total",
		Help: "Committed database writes (a transaction, or one statement outside one) by kind: the store method that wrote.",
	}, []string{"kind"})
	m.retries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cellvisor_control_db_retries_total",
		Help: "Database writes run again because the database could not serialize them at once (SQLite busy past its busy timeout, a PostgreSQL serialization failure or deadlock).",
	})
	m.seenRows = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cellvisor_control_last_seen_rows_written_total",
		Help: "Edges' last-seen times written to the database by the batched flushes (one row each).",
	})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cellvisor_control_edge_requests_refused_total",
		Help: "Edge-control requests answered 429 with Retry-After, by request class and reason: class_full (the class's requests in work at their bound) or edge_rate (one edge over its rate of elections).",
	}, []string{"class", "reason"})
	m.reg.MustRegister(m.refused, m.requests, m.polls, m.enrollments, m.acks, m.statuses, m.publish, m.builds, m.batches, m.held, m.placement, m.writes, m.retries, m.seenRows,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), &fleet{m: m}, &listenerCollector{m: m})
	return m
}

// Refused counts a request refused 429 by its class and reason.
func (m *Metrics) Refused(class, reason string) { m.refused.WithLabelValues(class, reason).Inc() }

// Classes exports every request class's class_full refusals from zero,
// so that a class never refused shows as such.
func (m *Metrics) Classes(classes []string) {
	for _, c := range classes {
		m.refused.WithLabelValues(c, "class_full")
	}
}

// Listener exports a bounded listener's connection counts under name
// (Edge, Admin), read at scrape time.
func (m *Metrics) Listener(name string, stats func() connlimit.Stats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listeners[name] = stats
}

var (
	listenerConnsDesc = prometheus.NewDesc("cellvisor_control_listener_connections",
		"Connections the listener holds open, by state: established (a verified client certificate; admin: a first request) or pending (not yet).", []string{"listener", "state"}, nil)
	listenerMaxDesc = prometheus.NewDesc("cellvisor_control_listener_max_connections",
		"The listener's cap on connections open at once.", []string{"listener"}, nil)
	listenerRefusedDesc = prometheus.NewDesc("cellvisor_control_listener_connections_refused_total",
		"New connections closed at once, every connection they would displace established, by reason: per_ip, full.", []string{"listener", "reason"}, nil)
	listenerDroppedDesc = prometheus.NewDesc("cellvisor_control_listener_connections_dropped_total",
		"Pending connections closed, the oldest first, to make room for a new one, by the cap reached: per_ip, pending, full.", []string{"listener", "reason"}, nil)
	listenerHandshakeDesc = prometheus.NewDesc("cellvisor_control_listener_handshakes_failed_total",
		"Connections closed before they were established, by reason: timeout (the handshake deadline), failed (a failed TLS handshake).", []string{"listener", "reason"}, nil)
)

// listenerCollector sends the bounded listeners' counts.
type listenerCollector struct{ m *Metrics }

func (c *listenerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{listenerConnsDesc, listenerMaxDesc, listenerRefusedDesc, listenerDroppedDesc, listenerHandshakeDesc} {
		ch <- d
	}
}

func (c *listenerCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	names := make([]string, 0, len(c.m.listeners))
	for n := range c.m.listeners {
		names = append(names, n)
	}
	stats := make([]connlimit.Stats, 0, len(names))
	sort.Strings(names)
	for _, n := range names {
		stats = append(stats, c.m.listeners[n]())
	}
	c.m.mu.Unlock()
	for i, n := range names {
		st := stats[i]
		ch <- prometheus.MustNewConstMetric(listenerConnsDesc, prometheus.GaugeValue, float64(st.Open-st.Pending), n, "established")
		ch <- prometheus.MustNewConstMetric(listenerConnsDesc, prometheus.GaugeValue, float64(st.Pending), n, "pending")
		ch <- prometheus.MustNewConstMetric(listenerMaxDesc, prometheus.GaugeValue, float64(st.Max), n)
		for _, v := range []struct {
			d      *prometheus.Desc
			reason string
			n      uint64
		}{
			{listenerRefusedDesc, "per_ip", st.RefusedPerIP}, {listenerRefusedDesc, "full", st.RefusedFull},
			{listenerDroppedDesc, "per_ip", st.DroppedPerIP}, {listenerDroppedDesc, "pending", st.DroppedPending}, {listenerDroppedDesc, "full", st.DroppedFull},
			{listenerHandshakeDesc, "timeout", st.HandshakeTimeouts}, {listenerHandshakeDesc, "failed", st.HandshakeFailures},
		} {
			ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n), n, v.reason)
		}
	}
}

// Handler serves the series in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: zap.NewStdLog(m.o.Logger), Timeout: m.o.ScrapeTimeout + 5*time.Second})
}

// Registry is the registry the series are on (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Request records one HTTP request.
func (m *Metrics) Request(listener, route string, code int, d time.Duration) {
	m.requests.WithLabelValues(listener, route, strconv.Itoa(code)).Observe(d.Seconds())
}

// Poll records a manifest poll's result.
func (m *Metrics) Poll(result string) { m.polls.WithLabelValues(result).Inc() }

// Enrollment records an enrollment's outcome.
func (m *Metrics) Enrollment(outcome string) { m.enrollments.WithLabelValues(outcome).Inc() }

// Ack records an ack's outcome.
func (m *Metrics) Ack(outcome string) { m.acks.WithLabelValues(outcome).Inc() }

// Status records a status report's result.
func (m *Metrics) Status(result string) { m.statuses.WithLabelValues(result).Inc() }

// Publish records a publish's duration.
func (m *Metrics) Publish(d time.Duration) { m.publish.Observe(d.Seconds()) }

// Build records the build of one edge's manifest: its duration, and
// whether it gave the edge a new sequence.
func (m *Metrics) Build(d time.Duration, advanced bool) {
	result := "unchanged"
	if advanced {
		result = "advanced"
	}
	m.builds.WithLabelValues(result).Observe(d.Seconds())
}

// Batch records how many writes one group-committed transaction carried.
func (m *Metrics) Batch(n int) { m.batches.Observe(float64(n)) }

// Held counts a poll held (+1) or answered after its hold (-1).
func (m *Metrics) Held(delta int) { m.held.Add(float64(delta)) }

// Placement records one placement's duration.
func (m *Metrics) Placement(d time.Duration) { m.placement.Observe(d.Seconds()) }

// Write records one committed database write.
func (m *Metrics) Write(kind string) { m.writes.WithLabelValues(kind).Inc() }

// Retry records a database write run again.
func (m *Metrics) Retry() { m.retries.Inc() }

// LastSeenRows records last-seen rows written by a flush.
func (m *Metrics) LastSeenRows(n int) { m.seenRows.Add(float64(n)) }

var (
	edgesDesc = prometheus.NewDesc("cellvisor_control_edges",
		"Edges by enrollment state (pending, enrolled).", []string{"state"}, nil)
	ageDesc = prometheus.NewDesc("cellvisor_control_edges_by_last_seen",
		"Enrolled edges by the age of their last contact: the band's lower bound in seconds (0, 60, 300, 900, 3600), or never.",
		[]string{"age"}, nil)
	lastSeenDesc = prometheus.NewDesc("cellvisor_control_edge_last_seen_timestamp_seconds",
		"When each enrolled edge last reached the control API (any replica's written time, or this replica's newer one), Unix seconds.",
		[]string{"edge"}, nil)
	leaseDesc = prometheus.NewDesc("cellvisor_control_egress_lease_holder",
		"1 for the edge holding the egress lease of (org, class).", []string{"org", "class", "edge"}, nil)
	leaseEpochDesc = prometheus.NewDesc("cellvisor_control_egress_lease_epoch",
		"The fencing epoch of the egress lease of (org, class): it grows with every new holder.", []string{"org", "class"}, nil)
	leaseExpiryDesc = prometheus.NewDesc("cellvisor_control_egress_lease_expiry_timestamp_seconds",
		"When the egress lease of (org, class) expires unless its holder renews it, Unix seconds.", []string{"org", "class"}, nil)
	poolMinReadyDesc = prometheus.NewDesc("cellvisor_control_pool_min_ready_cells",
		"The pool's minimum of ready cells on an edge for new placements there.", []string{"pool"}, nil)
	poolReadyDesc = prometheus.NewDesc("cellvisor_control_pool_ready_cells",
		"An edge's ready (running, ready, not drained) cells in a pool it has cells in, from its latest status report.", []string{"edge", "pool"}, nil)
	poolDomainsDesc = prometheus.NewDesc("cellvisor_control_pool_domains",
		"Domains whose active pool is the pool.", []string{"pool"}, nil)
	scrapeErrDesc = prometheus.NewDesc("cellvisor_control_fleet_scrape_error",
		"1 when this scrape could not read the fleet (its edge series are then missing).", nil, nil)
)

// fleet collects the per-edge, per-lease and per-pool series at scrape
// time, from the database: bounded by the fleet's size (one series per
// edge, one per pool each edge has cells in).
type fleet struct{ m *Metrics }

func (f *fleet) Describe(ch chan<- *prometheus.Desc) {
	ch <- edgesDesc
	ch <- ageDesc
	ch <- lastSeenDesc
	ch <- leaseDesc
	ch <- leaseEpochDesc
	ch <- leaseExpiryDesc
	ch <- poolMinReadyDesc
	ch <- poolReadyDesc
	ch <- poolDomainsDesc
	ch <- scrapeErrDesc
}

func (f *fleet) Collect(ch chan<- prometheus.Metric) {
	o := f.m.o
	ctx, cancel := context.WithTimeout(context.Background(), o.ScrapeTimeout)
	defer cancel()
	failed := 0.0
	edges, err := o.Fleet(ctx)
	if err != nil {
		o.Logger.Warn("metrics: read the fleet", zap.Error(err))
		failed = 1
	} else {
		collectEdges(ch, edges, o.Now())
	}
	if o.Leases != nil {
		leases, err := o.Leases(ctx)
		if err != nil {
			o.Logger.Warn("metrics: read the egress leases", zap.Error(err))
			failed = 1
		}
		collectLeases(ch, leases)
	}
	if o.Pools != nil {
		pools, err := o.Pools(ctx)
		if err != nil {
			o.Logger.Warn("metrics: read the pools", zap.Error(err))
			failed = 1
		}
		collectPools(ch, pools)
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, failed)
}

// collectLeases emits each lease's holder, epoch and expiry: one series
// each per (org, class).
func collectLeases(ch chan<- prometheus.Metric, leases []LeaseHolder) {
	for _, l := range leases {
		ch <- prometheus.MustNewConstMetric(leaseDesc, prometheus.GaugeValue, 1, l.Org, l.Class, l.Edge)
		ch <- prometheus.MustNewConstMetric(leaseEpochDesc, prometheus.GaugeValue, float64(l.Epoch), l.Org, l.Class)
		if !l.Expires.IsZero() {
			ch <- prometheus.MustNewConstMetric(leaseExpiryDesc, prometheus.GaugeValue, float64(l.Expires.UnixMilli())/1000, l.Org, l.Class)
		}
	}
}

// collectPools emits every pool's minimum and domains, and each edge's
// ready cells per pool: edges × their pools at most.
func collectPools(ch chan<- prometheus.Metric, p Pools) {
	for _, pl := range p.Pools {
		ch <- prometheus.MustNewConstMetric(poolMinReadyDesc, prometheus.GaugeValue, float64(pl.MinReady), pl.Name)
		ch <- prometheus.MustNewConstMetric(poolDomainsDesc, prometheus.GaugeValue, float64(pl.Domains), pl.Name)
	}
	for _, r := range p.Ready {
		ch <- prometheus.MustNewConstMetric(poolReadyDesc, prometheus.GaugeValue, float64(r.Ready), r.Edge, r.Pool)
	}
}

// collectEdges emits the edge counts, age bands and last-seen times.
func collectEdges(ch chan<- prometheus.Metric, edges []EdgeSeen, now time.Time) {
	var pending, enrolled, never float64
	bands := make([]float64, len(SilentAges))
	for _, e := range edges {
		if !e.Enrolled {
			pending++
			continue
		}
		enrolled++
		if e.LastSeen.IsZero() {
			never++
			continue
		}
		ch <- prometheus.MustNewConstMetric(lastSeenDesc, prometheus.GaugeValue, float64(e.LastSeen.UnixMilli())/1000, e.ID)
		bands[AgeBand(now.Sub(e.LastSeen))]++
	}
	ch <- prometheus.MustNewConstMetric(edgesDesc, prometheus.GaugeValue, pending, "pending")
	ch <- prometheus.MustNewConstMetric(edgesDesc, prometheus.GaugeValue, enrolled, "enrolled")
	for i, a := range SilentAges {
		ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, bands[i], strconv.Itoa(int(a.Seconds())))
	}
	ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, never, "never")
}

// AgeBand is the index in SilentAges of the band an age falls in (a
// negative age, from a clock behind, counts as 0).
func AgeBand(age time.Duration) int {
	i := 0
	for j, a := range SilentAges {
		if age >= a {
			i = j
		}
	}
	return i
}
