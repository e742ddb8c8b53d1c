package frontdoor

import (
	"fmt"
	"testing"
)

// BenchmarkResolve: one resolve among an org's 1,000 front doors, the
// control API's admin resolve and the cells' per-call work in Go terms.
func BenchmarkResolve(b *testing.B) {
	rows := make([]Row, 1000)
	for i := range rows {
		rows[i] = Row{Edge: fmt.Sprintf("edge-%04d", i), URL: fmt.Sprintf("https://shop-%04d.example.com:443", i)}
	}
	b.ReportAllocs()
	for b.Loop() {
		if edge, err := Resolve("HTTPS://Shop-0999.Example.com./cart", rows); err != nil || edge != "edge-0999" {
			b.Fatal(edge, err)
		}
	}
}

func BenchmarkNormalize(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Normalize("https://bücher.example/x"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTableResolve: the same resolve against rows checked once.
func BenchmarkTableResolve(b *testing.B) {
	rows := make([]Row, 1000)
	for i := range rows {
		rows[i] = Row{Edge: fmt.Sprintf("edge-%04d", i), URL: fmt.Sprintf("https://shop-%04d.example.com:443", i)}
	}
	t := NewTable(rows)
	b.ReportAllocs()
	for b.Loop() {
		if edge, err := t.Resolve("HTTPS://Shop-0999.Example.com./cart"); err != nil || edge != "edge-0999" {
			b.Fatal(edge, err)
		}
	}
}
