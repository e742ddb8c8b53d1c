package agentmetrics

import (
	"bytes"
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"

	"cellvisor/supervisor"
)

// gatherer hands collectors to client_golang's test helpers: it writes
// them in the agent's text format and parses that as a Prometheus server
// does, so every test through it checks the format too.
func gatherer(cs ...Collector) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		var buf bytes.Buffer
		if err := (&Registry{cs: cs}).Write(&buf); err != nil {
			return nil, err
		}
		return parse(buf.String())
	})
}

func parse(text string) ([]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, err
	}
	var out []*dto.MetricFamily
	for _, f := range fams {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, nil
}

// lintClean fails on anything client_golang's linter finds in g's series.
func lintClean(t *testing.T, g prometheus.Gatherer) {
	t.Helper()
	problems, err := promtest.GatherAndLint(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}

// checkDescribed fails unless every series c sends is of a family it
// describes, with that family's labels, and no series is sent twice (what
// client_golang's pedantic registry checked).
func checkDescribed(t *testing.T, c Collector) {
	t.Helper()
	described := c.Describe()
	seen := map[string]bool{}
	c.Collect(func(s sample) {
		if !slices.Contains(described, s.d) {
			t.Errorf("%s sent but not described", s.d.name)
		}
		want := len(s.d.labels)
		if s.kind == summaryKind && s.suffix == "" {
			want++
		}
		if len(s.values) != want {
			t.Errorf("%s sent with %d label values, want %d", s.d.name, len(s.values), want)
		}
		key := s.d.name + s.suffix + "\x00" + strings.Join(s.values, "\x00")
		if seen[key] {
			t.Errorf("%s%v sent twice", s.d.name+s.suffix, s.values)
		}
		seen[key] = true
	})
}

// fixed sends the samples it is given.
type fixed []sample

func (f fixed) Describe() []*Desc {
	var ds []*Desc
	for _, s := range f {
		if !slices.Contains(ds, s.d) {
			ds = append(ds, s.d)
		}
	}
	return ds
}

func (f fixed) Collect(emit func(sample)) {
	for _, s := range f {
		emit(s)
	}
}

// The text format: families in name order with their HELP and TYPE once,
// series in label order, help and label values escaped, floats written so
// that they read back the same, and a summary's quantiles before its sum
// and count.
func TestWriteFamilies(t *testing.T) {
	b := &Desc{name: "b_total", help: "B, with a back\\slash\nand a newline.", labels: []string{"x"}}
	a := &Desc{name: "a", help: "A."}
	s := &Desc{name: "s_seconds", help: "S."}
	var buf bytes.Buffer
	err := writeFamilies(&buf, []sample{
		{d: b, kind: counterKind, values: []string{"z"}, v: 2},
		{d: s, kind: summaryKind, suffix: "_count", v: 3},
		{d: b, kind: counterKind, values: []string{"q\"uo\\te\n"}, v: 1e21},
		{d: s, kind: summaryKind, values: []string{"1"}, v: 0.5},
		{d: a, kind: gaugeKind, v: math.Inf(1)},
		{d: s, kind: summaryKind, values: []string{"0"}, v: 0.25},
		{d: s, kind: summaryKind, suffix: "_sum", v: 1.75},
		{d: b, kind: counterKind, values: []string{"a"}, v: 1764629123.456},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `# HELP a A.
# TYPE a gauge
a +Inf
# HELP b_total B, with a back\\slash\nand a newline.
# TYPE b_total counter
b_total{x="a"} 1.764629123456e+09
b_total{x="q\"uo\\te\n"} 1e+21
b_total{x="z"} 2
# HELP s_seconds S.
# TYPE s_seconds summary
s_seconds{quantile="0"} 0.25
s_seconds{quantile="1"} 0.5
s_seconds_sum 1.75
s_seconds_count 3
`
	if got := buf.String(); got != want {
		t.Errorf("written:\n%s\nwant:\n%s", got, want)
	}
	fams, err := parse(buf.String())
	if err != nil {
		t.Fatalf("Prometheus's parser refuses it: %v", err)
	}
	if got := fams[1].GetMetric()[1].GetLabel()[0].GetValue(); got != "q\"uo\\te\n" {
		t.Errorf("label value read back as %q", got)
	}
	if got := fams[1].GetMetric()[0].GetCounter().GetValue(); got != 1764629123.456 {
		t.Errorf("value read back as %v", got)
	}
	if q := fams[2].GetMetric()[0].GetSummary(); q.GetSampleCount() != 3 || q.GetSampleSum() != 1.75 || len(q.GetQuantile()) != 2 {
		t.Errorf("summary read back as %v", q)
	}
}

// The agent process's own series are there, with the values of this
// process, and pass the linter.
func TestRuntimeAndProcessSeries(t *testing.T) {
	for _, c := range []Collector{runtimeCollector{}, processCollector{}} {
		checkDescribed(t, c)
	}
	// Run until the process has used a few clock ticks of CPU, so that its
	// CPU series can be held against getrusage's.
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	deadline := time.Now().Add(10 * time.Second)
	for x := 0; cpu() < 50*time.Millisecond && time.Now().Before(deadline); x++ {
		_ = strconv.Itoa(x)
	}
	before := cpu()
	reg := gatherer(runtimeCollector{}, processCollector{})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	after := cpu()
	value := func(name string) float64 {
		for _, f := range fams {
			if f.GetName() == name {
				m := f.GetMetric()[0]
				return m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		t.Errorf("no %s", name)
		return 0
	}
	if v := value("go_goroutines"); v < 1 {
		t.Errorf("go_goroutines %v", v)
	}
	// /proc counts in ticks of 10 ms, getrusage finer.
	if v := value("process_cpu_seconds_total"); v < before.Seconds()-0.02 || v > after.Seconds()+0.02 {
		t.Errorf("process_cpu_seconds_total %v, getrusage %v to %v", v, before.Seconds(), after.Seconds())
	}
	if v := value("process_resident_memory_bytes"); v < 1<<20 {
		t.Errorf("process_resident_memory_bytes %v", v)
	}
	start := time.Unix(int64(value("process_start_time_seconds")), 0)
	if since := time.Since(start); since < 0 || since > time.Hour {
		t.Errorf("process_start_time_seconds is %s ago, for a test process", since)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if v := value("process_open_fds"); v < 4 {
		t.Errorf("process_open_fds %v: stdio and /dev/null are open", v)
	}
	if v := value("process_max_fds"); v < value("process_open_fds") {
		t.Errorf("process_max_fds %v below the open ones", v)
	}
	lintClean(t, reg)
}

// A registry refuses two collectors describing the same family.
func TestRegistryRefusesADuplicateFamily(t *testing.T) {
	o := Options{Status: func(context.Context) supervisor.Status { return supervisor.Status{} }}
	o.Collectors = []Collector{fixed{{d: goInfo, kind: gaugeKind, values: []string{"x"}, v: 1}}}
	if _, err := NewRegistry(o); err == nil || !strings.Contains(err.Error(), "go_info") {
		t.Errorf("NewRegistry = %v, want go_info refused as described twice", err)
	}
}

// The handler serves the text format, and answers a scrape that comes
// while another runs 503 at once.
func TestHandlerServesOneScrapeAtATime(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	o := Options{Status: func(context.Context) supervisor.Status {
		entered <- struct{}{}
		<-release
		return fakeStatus(context.Background())
	}}
	reg, err := NewRegistry(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(reg, zap.NewNop()))
	t.Cleanup(srv.Close)
	type answer struct {
		code int
		body string
		ct   string
	}
	first := make(chan answer, 1)
	get := func() answer {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Error(err)
			return answer{}
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return answer{resp.StatusCode, b.String(), resp.Header.Get("Content-Type")}
	}
	go func() { first <- get() }()
	<-entered // the first scrape is reading the status
	if a := get(); a.code != http.StatusServiceUnavailable {
		t.Errorf("second scrape meanwhile: %d, want 503", a.code)
	}
	close(release)
	a := <-first
	if a.code != http.StatusOK || a.ct != contentType {
		t.Fatalf("first scrape: %d %q", a.code, a.ct)
	}
	if _, err := parse(a.body); err != nil {
		t.Errorf("scrape does not parse: %v", err)
	}
	if !strings.Contains(a.body, "cellvisor_cell_ready{cell=\"cell-01\",pool=\"shared-default\"} 1\n") {
		t.Errorf("scrape lacks cell-01's readiness:\n%s", a.body)
	}
}
