package placement

import (
	"testing"
)

// benchDomains are the names placed by the benchmarks, made once.
var benchDomains = domainNames(1_000_000)

// BenchmarkChoose32 places 1,000,000 domains over 32 cells with Choose (no
// bound, one replica): ns per placement. Its floor is BenchmarkBareHRW32.
func BenchmarkChoose32(b *testing.B) {
	cs, err := NewCells("edge-a", cellNames(32), nil)
	if err != nil {
		b.Fatal(err)
	}
	p := Pool{Replicas: 1}
	i := 0
	for b.Loop() {
		if _, err := cs.Choose(benchDomains[i%len(benchDomains)], p); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkChoose32Bounded is BenchmarkChoose32 with a per-cell bound no
// cell reaches and 2 replicas.
func BenchmarkChoose32Bounded2(b *testing.B) {
	cs, err := NewCells("edge-a", cellNames(32), nil)
	if err != nil {
		b.Fatal(err)
	}
	p := Pool{Replicas: 2, Bound: 1 << 30}
	i := 0
	for b.Loop() {
		if _, err := cs.Choose(benchDomains[i%len(benchDomains)], p); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkBareHRW32 is the floor: a bare highest-random-weight choice over
// 32 cells with the same fast 64-bit hash, no loads, bounds or result.
func BenchmarkBareHRW32(b *testing.B) {
	cells := cellNames(32)
	hashes := make([]uint64, len(cells))
	for i, c := range cells {
		hashes[i] = hashString(c)
	}
	i := 0
	var sink int
	for b.Loop() {
		key := keyHash(benchDomains[i%len(benchDomains)], "edge-a")
		best, bestScore := 0, uint64(0)
		for j, h := range hashes {
			if s := mix(key ^ h); s > bestScore {
				best, bestScore = j, s
			}
		}
		sink += best
		i++
	}
	_ = sink
}

// BenchmarkMovedFractionAddCell measures, computed fresh over 1,000,000
// domains, the fraction moved when a 33rd cell joins 32, against the ideal
// 1/33 (reported as moved/ideal: 1.0 is ideal).
func BenchmarkMovedFractionAddCell(b *testing.B) {
	for b.Loop() {
		before := chooseAll(b, "edge-a", cellNames(32), benchDomains, Pool{Replicas: 1})
		after := chooseAll(b, "edge-a", cellNames(33), benchDomains, Pool{Replicas: 1})
		frac := float64(moved(before, after)) / float64(len(benchDomains))
		b.ReportMetric(frac, "moved")
		b.ReportMetric(frac*33, "moved/ideal")
	}
}
