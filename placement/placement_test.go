package placement

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
)

func cellNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("cell-%02d", i+1)
	}
	return out
}

func domainNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("d%d.example.com", i)
	}
	return out
}

// chooseAll places every domain fresh, with no durable state.
func chooseAll(t testing.TB, edge string, cells, domains []string, p Pool) Placement {
	t.Helper()
	cs, err := NewCells(edge, cells, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make(Placement, len(domains))
	for _, d := range domains {
		if out[d], err = cs.Choose(d, p); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func moved(a, b Placement) int {
	n := 0
	for d, cells := range a {
		if !slices.Equal(cells, b[d]) {
			n++
		}
	}
	return n
}

// Computed fresh, adding a ninth cell to eight moves about 1/9 of the
// domains (those the new cell wins), within 1 % of 1/9.
func TestFreshComputationMovesAboutOneNinth(t *testing.T) {
	domains := domainNames(100_000)
	p := Pool{Replicas: 1}
	before := chooseAll(t, "edge-a", cellNames(8), domains, p)
	after := chooseAll(t, "edge-a", cellNames(9), domains, p)
	got := float64(moved(before, after)) / float64(len(domains))
	if want := 1.0 / 9; math.Abs(got-want) > 0.01 {
		t.Errorf("moved %.4f of the domains, want %.4f ± 0.01", got, want)
	}
	// And every domain that moved went to the new cell.
	for d, cells := range after {
		if !slices.Equal(cells, before[d]) && cells[0] != "cell-09" {
			t.Fatalf("%s moved from %v to %v, not to the new cell", d, before[d], cells)
		}
	}
}

// Durable placements: adding a cell or an unrelated domain moves nothing.
func TestDurablePlacementMovesNothingOnAdd(t *testing.T) {
	domains := domainNames(100_000)
	p := Pool{Replicas: 1}
	first, moves, err := Place(p, "edge-a", cellNames(8), nil, domains)
	if err != nil || len(moves) != 0 {
		t.Fatalf("first placement: %v, %d moves", err, len(moves))
	}
	second, moves, err := Place(p, "edge-a", cellNames(9), first, append(domains, "new.example.com"))
	if err != nil {
		t.Fatal(err)
	}
	if len(moves) != 0 || moved(first, second) != 0 {
		t.Errorf("adding a cell and a domain moved %d domains (%d moves)", moved(first, second), len(moves))
	}
	if len(second["new.example.com"]) != 1 {
		t.Errorf("the new domain got %v", second["new.example.com"])
	}
}

// Removing (or unassigning) a cell moves exactly the domains that were on
// it, each to another cell; the rest stay.
func TestRemovingACellMovesExactlyItsDomains(t *testing.T) {
	for _, replicas := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(replicas, " replicas"), func(t *testing.T) {
			domains := domainNames(20_000)
			p := Pool{Replicas: replicas}
			first, _, err := Place(p, "edge-a", cellNames(8), nil, domains)
			if err != nil {
				t.Fatal(err)
			}
			remaining := slices.DeleteFunc(cellNames(8), func(c string) bool { return c == "cell-03" })
			second, moves, err := Place(p, "edge-a", remaining, first, domains)
			if err != nil {
				t.Fatal(err)
			}
			on3 := 0
			for d, cells := range first {
				had := slices.Contains(cells, "cell-03")
				if had {
					on3++
				}
				if changed := !slices.Equal(cells, second[d]); changed != had {
					t.Fatalf("%s: %v → %v (was on cell-03: %v)", d, cells, second[d], had)
				}
				if slices.Contains(second[d], "cell-03") {
					t.Fatalf("%s still on the removed cell", d)
				}
				// The surviving replicas stay: only the lost one is replaced.
				for _, c := range cells {
					if c != "cell-03" && !slices.Contains(second[d], c) {
						t.Fatalf("%s lost its replica on %s: %v → %v", d, c, cells, second[d])
					}
				}
			}
			if len(moves) != on3 || on3 == 0 {
				t.Errorf("%d moves for %d domains on the removed cell", len(moves), on3)
			}
		})
	}
}

// Replicas always land on distinct cells, and per-cell bounds always hold.
func TestReplicasDistinctAndBoundsHold(t *testing.T) {
	for _, tc := range []struct {
		cells, domains int
		p              Pool
	}{
		{8, 1000, Pool{Replicas: 2}},
		{3, 999, Pool{Replicas: 3}},
		{4, 300, Pool{Replicas: 2, Bound: 160}}, // nearly full: 600 of 640
		{8, 5000, Pool{Replicas: 1, Bound: 700}},
		{32, 20000, Pool{Replicas: 3, Bound: 2000}},
	} {
		t.Run(fmt.Sprintf("%d cells %d domains %+v", tc.cells, tc.domains, tc.p), func(t *testing.T) {
			got, _, err := Place(tc.p, "edge-b", cellNames(tc.cells), nil, domainNames(tc.domains))
			if err != nil {
				t.Fatal(err)
			}
			load := map[string]int{}
			for d, cells := range got {
				if len(cells) != tc.p.Replicas {
					t.Fatalf("%s has %d cells, want %d", d, len(cells), tc.p.Replicas)
				}
				uniq := slices.Clone(cells)
				slices.Sort(uniq)
				if len(slices.Compact(uniq)) != len(cells) {
					t.Fatalf("%s on %v: replicas share a cell", d, cells)
				}
				for _, c := range cells {
					load[c]++
				}
			}
			for c, n := range load {
				if tc.p.Bound > 0 && n > tc.p.Bound {
					t.Errorf("%s holds %d domains, bound %d", c, n, tc.p.Bound)
				}
			}
		})
	}
}

// Past capacity: refused with ErrNoCapacity, nothing placed.
func TestNoCapacityRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cells   int
		domains int
		p       Pool
	}{
		{"bound reached", 2, 11, Pool{Replicas: 1, Bound: 5}},
		{"fewer cells than replicas", 2, 1, Pool{Replicas: 3}},
		{"no cell", 0, 1, Pool{Replicas: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := Place(tc.p, "e", cellNames(tc.cells), nil, domainNames(tc.domains))
			if !errors.Is(err, ErrNoCapacity) || got != nil {
				t.Errorf("err %v, placement %d: want ErrNoCapacity and nothing", err, len(got))
			}
		})
	}
	if _, _, err := Place(Pool{Replicas: 4}, "e", cellNames(8), nil, domainNames(1)); err == nil || errors.Is(err, ErrNoCapacity) {
		t.Errorf("4 replicas: %v, want the pool refused", err)
	}
}

// The same inputs give the same placement on every control replica: no
// per-process seed, no map order.
func TestDeterministic(t *testing.T) {
	a, _, _ := Place(Pool{Replicas: 2, Bound: 40}, "edge-c", cellNames(8), nil, domainNames(300))
	cells := cellNames(8)
	slices.Reverse(cells)
	domains := domainNames(300)
	slices.Reverse(domains)
	b, _, _ := Place(Pool{Replicas: 2, Bound: 40}, "edge-c", cells, nil, domains)
	if moved(a, b) != 0 {
		t.Errorf("%d domains placed differently for the same inputs in another order", moved(a, b))
	}
	// Pinned: these values only change with the hash, which would move
	// every placement in a fleet.
	if got := hashString("shop.example.com"); got != hashString("shop.example.com") || keyHash("a", "b") == keyHash("b", "a") {
		t.Error("hash is not a function of its input, or ignores the order of domain and edge")
	}
}

// Rendezvous spreads evenly: over 8 cells no cell gets more than 5 % over
// its share of 100,000 domains.
func TestSpread(t *testing.T) {
	got := chooseAll(t, "edge-a", cellNames(8), domainNames(100_000), Pool{Replicas: 1})
	load := map[string]int{}
	for _, cells := range got {
		load[cells[0]]++
	}
	for c, n := range load {
		if share := float64(n) / 100_000 * 8; share > 1.05 || share < 0.95 {
			t.Errorf("%s holds %d domains: %.3f of its share", c, n, share)
		}
	}
}
