// Package placement decides which cells of an edge serve a domain: pure
// functions of names, counts and the placements already made, with no
// store, clock or network. A domain gets `replicas` distinct cells of its
// pool on each edge where the pool participates, chosen by rendezvous
// (highest-random-weight) hashing of (domain, edge, cell) among the cells
// below the pool's per-cell bound. Placements are durable: they are computed
// once and then kept, so adding an unrelated domain or a cell moves nothing,
// and removing a cell moves only the domains that were on it.
//
// The control plane's store (controlapi/store) imports it; it imports
// nothing of this module.
package placement

import (
	"errors"
	"fmt"
	"slices"
)

// ErrNoCapacity is returned when fewer cells than replicas can take a
// domain (none left below the bound, or too few cells).
var ErrNoCapacity = errors.New("not enough cells below the pool's per-cell bound")

// Pool is what placement needs of a pool.
type Pool struct {
	// Replicas is how many distinct cells of an edge serve each domain.
	Replicas int
	// Bound is the most domains one cell may hold; 0 means no bound.
	Bound int
}

// Validate checks the pool's numbers.
func (p Pool) Validate() error {
	switch {
	case p.Replicas < 1 || p.Replicas > 3:
		return fmt.Errorf("replicas must be 1–3, got %d", p.Replicas)
	case p.Bound < 0:
		return fmt.Errorf("bound must be 0 (none) or more, got %d", p.Bound)
	}
	return nil
}

// Cells is one edge's cells of one pool with their current loads, ready to
// place domains on. Build it with NewCells; Choose and Place update the
// loads as they place.
type Cells struct {
	edge  string
	names []string
	hash  []uint64 // per cell: its name's hash, mixed per key in Choose
	load  []int
}

// NewCells prepares the cells named (in any order; duplicates refused) of
// edge, with load[name] domains already on each.
func NewCells(edge string, names []string, load map[string]int) (*Cells, error) {
	c := &Cells{edge: edge, names: slices.Clone(names)}
	slices.Sort(c.names)
	for i := 1; i < len(c.names); i++ {
		if c.names[i] == c.names[i-1] {
			return nil, fmt.Errorf("cell %s named twice", c.names[i])
		}
	}
	c.hash = make([]uint64, len(c.names))
	c.load = make([]int, len(c.names))
	for i, n := range c.names {
		c.hash[i] = hashString(n)
		c.load[i] = load[n]
	}
	return c, nil
}

// Names are the cells, sorted.
func (c *Cells) Names() []string { return c.names }

// Load is how many domains cell holds now.
func (c *Cells) Load(cell string) int {
	if i, ok := slices.BinarySearch(c.names, cell); ok {
		return c.load[i]
	}
	return 0
}

// Choose places domain: the Replicas cells with the highest rendezvous
// scores among those below the bound, highest first, and counts it on them.
// It does not look at any earlier placement: Place keeps those.
func (c *Cells) Choose(domain string, p Pool) ([]string, error) {
	return c.choose(domain, p, p.Replicas, nil)
}

// choose picks need cells for domain, skipping those in except (cells that
// already hold it) and those at the bound.
func (c *Cells) choose(domain string, p Pool, need int, except []string) ([]string, error) {
	if need < 1 || need > maxReplicas {
		return nil, fmt.Errorf("placement: %d replicas asked, 1–%d possible", need, maxReplicas)
	}
	key := keyHash(domain, c.edge)
	// The top need scores, highest first, in fixed arrays: no allocation.
	var best [maxReplicas]int
	var score [maxReplicas]uint64
	n := 0
	bounded := p.Bound > 0 || len(except) > 0
	for i, h := range c.hash {
		if bounded && (p.Bound > 0 && c.load[i] >= p.Bound || slices.Contains(except, c.names[i])) {
			continue
		}
		s := mix(key ^ h)
		if n == need && s <= score[need-1] {
			continue // the common case: not among the best so far
		}
		// Insert s, shifting lower scores down (at most 3 entries).
		j := min(n, need-1)
		for j > 0 && score[j-1] < s {
			best[j], score[j] = best[j-1], score[j-1]
			j--
		}
		best[j], score[j] = i, s
		n = min(n+1, need)
	}
	if n < need {
		return nil, fmt.Errorf("%w: %s on edge %s needs %d more cell(s), %d available", ErrNoCapacity, domain, c.edge, need, n)
	}
	out := make([]string, n)
	for k := range n {
		c.load[best[k]]++
		out[k] = c.names[best[k]]
	}
	return out, nil
}

const maxReplicas = 3

// Placement maps each domain to its cells on one edge.
type Placement map[string][]string

// Move is a domain whose cells change: it is added to To's cells not in
// From first (target-first), and only then removed from From's others.
type Move struct {
	Domain   string
	From, To []string
}

// Place places domains on one edge's cells of a pool, durably. A domain of
// current keeps every cell of its that still exists; a replica on a cell
// that is gone (or a missing replica) is replaced by the best other cell
// below the bound. A domain not in current is placed fresh. Domains of
// current not in domains are dropped. The result holds every domain of
// domains; moves lists the domains whose cells changed. ErrNoCapacity (with
// nothing placed) when some domain cannot get its replicas.
func Place(p Pool, edge string, cells []string, current Placement, domains []string) (Placement, []Move, error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	exists := make(map[string]bool, len(cells))
	for _, c := range cells {
		exists[c] = true
	}
	want := slices.Clone(domains)
	slices.Sort(want)
	want = slices.Compact(want)
	// Loads count what stays: the kept replicas of wanted domains.
	kept := make(Placement, len(want))
	load := map[string]int{}
	for _, d := range want {
		for _, c := range current[d] {
			if exists[c] && !slices.Contains(kept[d], c) && len(kept[d]) < p.Replicas {
				kept[d] = append(kept[d], c)
				load[c]++
			}
		}
	}
	cs, err := NewCells(edge, cells, load)
	if err != nil {
		return nil, nil, err
	}
	out := make(Placement, len(want))
	var moves []Move
	for _, d := range want {
		have := kept[d]
		if len(have) < p.Replicas {
			more, err := cs.choose(d, p, p.Replicas-len(have), have)
			if err != nil {
				return nil, nil, err
			}
			have = append(slices.Clone(have), more...)
		}
		out[d] = have
		if prev, ok := current[d]; ok && !slices.Equal(prev, have) {
			moves = append(moves, Move{Domain: d, From: prev, To: have})
		}
	}
	return out, moves, nil
}

// keyHash hashes (domain, edge) once per placement: each cell's score is
// then one mix of it with the cell's own hash, so that scoring N cells costs
// N multiplications, not N hashes of strings.
func keyHash(domain, edge string) uint64 {
	return mix(hashString(domain) ^ mix(hashString(edge)+0x9e3779b97f4a7c15))
}

// hashString is a fast 64-bit string hash, 8 bytes a step (a wyhash-like
// multiply-mix; deterministic across processes and hosts, unlike
// hash/maphash, because placements computed by different control replicas
// must agree).
func hashString(s string) uint64 {
	h := uint64(len(s)) * 0x9e3779b97f4a7c15
	for len(s) >= 8 {
		w := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = mix(h ^ w)
		s = s[8:]
	}
	var w uint64
	for i := 0; i < len(s); i++ {
		w |= uint64(s[i]) << (8 * i)
	}
	return mix(h ^ w ^ 0xff51afd7ed558ccd)
}

// mix is MurmurHash3's 64-bit finalizer: every input bit affects every
// output bit.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
