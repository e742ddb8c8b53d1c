package agentmetrics

import (
	"bufio"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// The agent writes Prometheus's text exposition format (version 0.0.4)
// itself rather than link client_golang: that library's package
// initialisers (its default registry's Go and process collectors, procfs,
// protobuf descriptors) ran on every start of the agent, before its first
// cell, for about 1.5-2 ms (docs/performance.md, round 8). Every series is
// a gauge, a counter or a summary, read when scraped.

// kind is a metric family's Prometheus type.
type kind string

const (
	gaugeKind   kind = "gauge"
	counterKind kind = "counter"
	summaryKind kind = "summary"
)

// Desc describes a metric family: its name, help and label names.
type Desc struct {
	name   string
	help   string
	labels []string
}

// Name is the family's name.
func (d *Desc) Name() string { return d.name }

// sample is one series of a family, of the family's kind: label values
// in the order of the family's label names. A summary's quantile lines
// carry one more label value, the quantile; its other lines have the
// suffix "_sum" or "_count".
type sample struct {
	d      *Desc
	kind   kind
	suffix string
	values []string
	v      float64
}

// Collector sends its series to emit when scraped.
type Collector interface {
	// Describe lists every family the collector may send.
	Describe() []*Desc
	// Collect sends the current series.
	Collect(emit func(sample))
}

// writeFamilies writes samples as client_golang writes them, so that
// scrapes compare line by line: families in name order, each with its HELP
// and TYPE lines once; in a series, labels in name order (a summary's
// quantile last); series in the order of those label values.
func writeFamilies(w io.Writer, samples []sample) error {
	// A line is a sample with its labels in the order they are written.
	type line struct {
		s           sample
		names, vals []string
	}
	lines := make([]line, 0, len(samples))
	orders := map[*Desc][]int{} // a family's label order, once per write
	for _, s := range samples {
		l := line{s: s}
		order, ok := orders[s.d]
		if !ok {
			order = s.d.order()
			orders[s.d] = order
		}
		for _, i := range order {
			if i < len(s.values) {
				l.names = append(l.names, s.d.labels[i])
				l.vals = append(l.vals, s.values[i])
			}
		}
		if s.kind == summaryKind && s.suffix == "" && len(s.values) > len(s.d.labels) {
			l.names = append(l.names, "quantile")
			l.vals = append(l.vals, s.values[len(s.d.labels)])
		}
		lines = append(lines, l)
	}
	slices.SortStableFunc(lines, func(a, b line) int {
		if c := strings.Compare(a.s.d.name, b.s.d.name); c != 0 {
			return c
		}
		n := len(a.s.d.labels) // before a summary's quantile
		if c := slices.Compare(a.vals[:min(n, len(a.vals))], b.vals[:min(n, len(b.vals))]); c != 0 {
			return c
		}
		if c := suffixOrder(a.s.suffix) - suffixOrder(b.s.suffix); c != 0 {
			return c
		}
		return slices.Compare(a.vals, b.vals)
	})
	bw := bufio.NewWriter(w)
	var last *Desc
	for _, l := range lines {
		if d := l.s.d; d != last {
			last = d
			bw.WriteString("# HELP " + d.name + " " + escapeHelp(d.help) + "\n")
			bw.WriteString("# TYPE " + d.name + " " + string(l.s.kind) + "\n")
		}
		bw.WriteString(l.s.d.name + l.s.suffix)
		if len(l.names) > 0 {
			bw.WriteByte('{')
			for i, name := range l.names {
				if i > 0 {
					bw.WriteByte(',')
				}
				bw.WriteString(name + `="` + escapeLabel(l.vals[i]) + `"`)
			}
			bw.WriteByte('}')
		}
		bw.WriteByte(' ')
		bw.WriteString(formatFloat(l.s.v))
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// order is the indexes of d's label names in name order.
func (d *Desc) order() []int {
	idx := make([]int, len(d.labels))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return strings.Compare(d.labels[a], d.labels[b]) })
	return idx
}

// suffixOrder puts a summary's quantile lines first, then its _sum, then
// its _count.
func suffixOrder(s string) int {
	switch s {
	case "":
		return 0
	case "_sum":
		return 1
	}
	return 2
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// formatFloat writes v as the text format reads it: the shortest
// representation that parses back to v, and +Inf, -Inf, NaN.
func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
