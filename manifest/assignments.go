package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"cellvisor/domain"
)

// assignmentsDomain separates the assignments digest from every other
// signed or hashed thing.
var assignmentsDomain = []byte("cellvisor/assignments/v1\x00")

// Bounds of the per-pool limits a cell enforces.
const (
	MaxPoolConns = 1_000_000
	MaxPoolRate  = 1_000_000
)

// isCellName reports whether s names a cell slot: cell-NN.
func isCellName(s string) bool {
	return len(s) == len("cell-00") && strings.HasPrefix(s, "cell-") && s[5] >= '0' && s[5] <= '9' && s[6] >= '0' && s[6] <= '9'
}

// Assignments are an edge's cell assignments and the policies of the pools
// they serve, as the control plane signs them into a manifest: the header's
// AssignmentsDigest covers them, so nobody without the key can repurpose a
// cell or loosen a pool's limits. A manifest without them (nil) leaves the
// edge's assignments as they are.
type Assignments struct {
	// Cells maps each assigned cell (cell-NN) to its pool; an unassigned
	// cell is absent.
	Cells map[string]string `json:"cells"`
	// Pools are the policies of the pools named in Cells, by pool name.
	Pools map[string]PoolPolicy `json:"pools"`
}

// PoolPolicy is what every cell of a pool enforces on an edge.
type PoolPolicy struct {
	// Class is the pool's class: shared, reserved, dedicated or quarantine.
	Class string `json:"class"`
	// MaxConns is each cell's limit of concurrent client connections
	// (answered 503 past it); 0 means none.
	MaxConns int `json:"max_conns"`
	// Rate is each cell's request rate limit, requests per second, per
	// client address (answered 429 past it, after Burst); 0 means none.
	Rate  int `json:"rate"`
	Burst int `json:"burst"`
}

// Validate checks cell names, pool names and classes, that every assigned
// pool has a policy and every policy an assigned cell, and the limits.
func (a Assignments) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: assignments: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if len(a.Cells) > 32 {
		return bad("%d cells, at most 32", len(a.Cells))
	}
	used := map[string]bool{}
	for cell, pool := range a.Cells {
		if !isCellName(cell) {
			return bad("cell %q is not cell-NN", cell)
		}
		if !validPool(pool) {
			return bad("%s: pool %q is not a shared-, reserved-, dedicated- or quarantine- pool", cell, pool)
		}
		if _, ok := a.Pools[pool]; !ok {
			return bad("%s: pool %s has no policy", cell, pool)
		}
		used[pool] = true
	}
	for name, p := range a.Pools {
		class, _ := domain.PoolClass(name)
		switch {
		case !used[name]:
			return bad("pool %s has a policy but no cell", name)
		case p.Class != class:
			return bad("pool %s: class %q, its name says %q", name, p.Class, class)
		case p.MaxConns < 0 || p.MaxConns > MaxPoolConns:
			return bad("pool %s: max_conns %d is not 0–%d", name, p.MaxConns, MaxPoolConns)
		case p.Rate < 0 || p.Rate > MaxPoolRate || p.Burst < 0 || p.Burst > MaxPoolRate:
			return bad("pool %s: rate %d and burst %d must be 0–%d", name, p.Rate, p.Burst, MaxPoolRate)
		}
	}
	return nil
}

// AssignmentsDigest is the lowercase hex SHA-256 the header signs for a:
// its own domain-separation prefix, the edge id, then every cell and every
// pool policy in name order, length-prefixed. Empty for nil.
func AssignmentsDigest(edgeID string, a *Assignments) string {
	if a == nil {
		return ""
	}
	var b []byte
	put := func(f string) {
		b = strconv.AppendInt(b, int64(len(f)), 10)
		b = append(b, ':')
		b = append(b, f...)
	}
	b = append(b, assignmentsDomain...)
	put(edgeID)
	cells := make([]string, 0, len(a.Cells))
	for c := range a.Cells {
		cells = append(cells, c)
	}
	slices.Sort(cells)
	put(strconv.Itoa(len(cells)))
	for _, c := range cells {
		put(c)
		put(a.Cells[c])
	}
	pools := make([]string, 0, len(a.Pools))
	for p := range a.Pools {
		pools = append(pools, p)
	}
	slices.Sort(pools)
	put(strconv.Itoa(len(pools)))
	for _, name := range pools {
		p := a.Pools[name]
		pj, _ := json.Marshal(p) // fixed fields, fixed order
		put(name)
		put(string(pj))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
