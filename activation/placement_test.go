package activation

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cellvisor/domain"
	"cellvisor/manifest"
	"cellvisor/runtime"
)

// entry signs an artifact of d in pool for seq, served only by cells when
// any are given.
func (r *rig) entry(d, pool string, seq int64, body string, cells ...string) manifest.Entry {
	art := domainJSON(d, pool, seq, body)
	e := manifest.Entry{Domain: d, Pool: pool, Revision: seq, Cells: cells}
	ne := manifest.NewEntry(r.priv, edge, d, pool, seq, art)
	e.Size, e.SHA256 = ne.Size, ne.SHA256
	e.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(r.priv, manifest.SigningMessage(edge, e)))
	r.src.mu.Lock()
	r.src.artifacts[e.SHA256] = art
	r.src.mu.Unlock()
	return e
}

func (r *rig) serve(seq int64, a *manifest.Assignments, entries ...manifest.Entry) {
	r.src.mu.Lock()
	r.src.m = manifest.Manifest{EdgeID: edge, Sequence: seq, Entries: entries, Assignments: a}
	r.src.mu.Unlock()
}

func (r *rig) poll() {
	r.t.Helper()
	if err := r.a.Poll(context.Background()); err != nil {
		r.t.Fatal(err)
	}
}

var reservedEU = manifest.PoolPolicy{Class: "reserved", MaxConns: 64, Rate: 100, Burst: 20}

// Signed assignments are applied with the domains in one activation: the
// newly assigned cell gets its pool's release, the unassigned one is
// retired with an empty runtime, the assignments and limits are persisted
// only once applied, and a cold start uses them.
func TestSignedAssignmentsAreAppliedAndPersisted(t *testing.T) {
	r := newRig(t)
	r.serve(1, nil, r.entry("a.example.com", domain.PoolSharedDefault, 1, "a"), r.entry("q.example.com", domain.PoolQuarantineDefault, 1, "q"))
	r.poll()
	if _, err := runtime.Current(r.slot("cell-02")); err != nil {
		t.Fatalf("cell-02 has no release: %v", err)
	}
	// cell-02 leaves quarantine; cell-03 joins reserved-eu.
	asg := &manifest.Assignments{
		Cells: map[string]string{"cell-01": domain.PoolSharedDefault, "cell-03": "reserved-eu"},
		Pools: map[string]manifest.PoolPolicy{domain.PoolSharedDefault: {Class: "shared"}, "reserved-eu": reservedEU},
	}
	r.serve(2, asg, r.entry("a.example.com", domain.PoolSharedDefault, 1, "a"), r.entry("r.example.com", "reserved-eu", 2, "r"))
	r.poll()
	if a := r.lastAck(); a.Sequence != 2 || a.Status != manifest.AckApplied {
		t.Fatalf("ack %+v", a)
	}
	if _, err := runtime.Current(r.slot("cell-02")); !errors.Is(err, runtime.ErrNoRelease) {
		t.Errorf("cell-02 runtime after unassignment: %v, want empty", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(r.slot("cell-02").RuntimeDir(), "releases")); len(ents) != 0 {
		t.Errorf("cell-02 still holds %d releases", len(ents))
	}
	if r.cells.pools["cell-02"] != "" || r.cells.pools["cell-03"] != "reserved-eu" {
		t.Errorf("supervisor told %v", r.cells.pools)
	}
	m, err := runtime.Current(r.slot("cell-03"))
	if err != nil || m.Pool != "reserved-eu" || m.Sequence != 2 {
		t.Fatalf("cell-03 release %+v, %v", m, err)
	}
	if j := r.poolJSON("cell-03"); !strings.Contains(j, "r.example.com") {
		t.Errorf("cell-03 pool JSON %s", j)
	}
	conf, _ := os.ReadFile(r.slot("cell-03").ConfPath())
	for _, want := range []string{"limit_conn cv_conn 64;", "rate=100r/s", "burst=20 nodelay"} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("cell-03 nginx.conf lacks %q", want)
		}
	}
	if conf, _ := os.ReadFile(r.slot("cell-01").ConfPath()); strings.Contains(string(conf), "limit_conn") {
		t.Error("cell-01's pool has no limits, but its nginx.conf has")
	}
	// Persisted: a cold start loads these assignments and limits.
	got, err := runtime.LoadOrCreateAssignments(r.state, r.topo)
	if err != nil || len(got) != 2 || got["cell-03"] != "reserved-eu" || got["cell-02"] != "" {
		t.Fatalf("persisted assignments %v, %v", got, err)
	}
	limits, err := runtime.LoadPoolLimits(r.state)
	if err != nil || limits["reserved-eu"] != (runtime.PoolLimits{MaxConns: 64, Rate: 100, Burst: 20}) {
		t.Fatalf("persisted limits %v, %v", limits, err)
	}
	// A manifest without assignments keeps them (and the limits).
	o := r.a.o
	o.Assignments, o.PoolLimits = got, limits
	if r.a, err = New(o); err != nil {
		t.Fatal(err)
	}
	r.serve(3, nil, r.entry("a.example.com", domain.PoolSharedDefault, 1, "a"), r.entry("r.example.com", "reserved-eu", 3, "r3"))
	r.poll()
	if a := r.lastAck(); a.Sequence != 3 || a.Status != manifest.AckApplied {
		t.Fatalf("ack %+v", a)
	}
	conf, _ = os.ReadFile(r.slot("cell-03").ConfPath())
	if !strings.Contains(string(conf), "limit_conn cv_conn 64;") {
		t.Error("limits lost on a manifest without assignments")
	}
	// Reassigned: cell-03 moves to shared-default, keeping its paths.
	asg2 := &manifest.Assignments{
		Cells: map[string]string{"cell-01": domain.PoolSharedDefault, "cell-03": domain.PoolSharedDefault},
		Pools: map[string]manifest.PoolPolicy{domain.PoolSharedDefault: {Class: "shared", MaxConns: 8}},
	}
	r.serve(4, asg2, r.entry("a.example.com", domain.PoolSharedDefault, 1, "a"))
	r.poll()
	m, err = runtime.Current(r.slot("cell-03"))
	if err != nil || m.Pool != domain.PoolSharedDefault || !strings.Contains(r.poolJSON("cell-03"), "a.example.com") {
		t.Fatalf("cell-03 after reassignment %+v, %v: %s", m, err, r.poolJSON("cell-03"))
	}
}

// Each cell holds only its own domains: entries with cells go to those
// cells only, entries without go to every cell of their pool, and cells
// with the same selection share content.
func TestEntriesGoOnlyToTheirCells(t *testing.T) {
	r := newRig(t)
	asg := &manifest.Assignments{
		Cells: map[string]string{"cell-01": "reserved-eu", "cell-02": "reserved-eu", "cell-03": "reserved-eu"},
		Pools: map[string]manifest.PoolPolicy{"reserved-eu": reservedEU},
	}
	r.serve(1, asg,
		r.entry("all.example.com", "reserved-eu", 1, "all"),
		r.entry("one.example.com", "reserved-eu", 1, "one", "cell-01"),
		r.entry("two.example.com", "reserved-eu", 1, "two", "cell-02", "cell-03"))
	r.poll()
	has := map[string][]string{
		"cell-01": {"all.example.com", "one.example.com"},
		"cell-02": {"all.example.com", "two.example.com"},
		"cell-03": {"all.example.com", "two.example.com"},
	}
	for cell, want := range has {
		j := r.poolJSON(cell)
		for _, d := range []string{"all.example.com", "one.example.com", "two.example.com"} {
			if strings.Contains(j, `"`+d+`"`) != contains(want, d) {
				t.Errorf("%s: holds %s = %v, want %v (%s)", cell, d, !contains(want, d), contains(want, d), j)
			}
		}
	}
	m2, _ := runtime.Current(r.slot("cell-02"))
	m3, _ := runtime.Current(r.slot("cell-03"))
	if m2.Files["pools/reserved-eu.json"] != m3.Files["pools/reserved-eu.json"] {
		t.Error("cell-02 and cell-03 hold the same domains but different pool JSON")
	}
}

// An entry's cells are authoritative, whatever their pool: during a move
// one domain is served by the source and target cells, each cell keeping
// its own pool; cells it does not name, of either pool, do not serve it.
func TestEntryCellsMaySpanPools(t *testing.T) {
	r := newRig(t)
	asg := &manifest.Assignments{
		Cells: map[string]string{"cell-01": domain.PoolSharedDefault, "cell-02": domain.PoolSharedDefault,
			"cell-03": "reserved-eu"},
		Pools: map[string]manifest.PoolPolicy{domain.PoolSharedDefault: {Class: "shared"}, "reserved-eu": reservedEU},
	}
	r.serve(1, asg,
		r.entry("m.example.com", domain.PoolSharedDefault, 1, "m", "cell-01", "cell-03"),
		r.entry("s.example.com", domain.PoolSharedDefault, 1, "s"))
	r.poll()
	if a := r.lastAck(); a.Sequence != 1 || a.Status != manifest.AckApplied {
		t.Fatalf("ack %+v", a)
	}
	has := map[string][]string{
		"cell-01": {"m.example.com", "s.example.com"},
		"cell-02": {"s.example.com"},
		"cell-03": {"m.example.com"},
	}
	for cell, want := range has {
		j := r.poolJSON(cell)
		for _, d := range []string{"m.example.com", "s.example.com"} {
			if strings.Contains(j, `"`+d+`"`) != contains(want, d) {
				t.Errorf("%s: holds %s = %v, want %v (%s)", cell, d, !contains(want, d), contains(want, d), j)
			}
		}
	}
	for cell, pool := range asg.Cells {
		if m, err := runtime.Current(r.slot(cell)); err != nil || m.Pool != pool {
			t.Errorf("%s release %+v, %v: want pool %s", cell, m, err, pool)
		}
	}
	// The move ends: the entry names the target cell under the target pool.
	r.serve(2, asg, r.entry("m.example.com", "reserved-eu", 2, "m2", "cell-03"), r.entry("s.example.com", domain.PoolSharedDefault, 1, "s"))
	r.poll()
	if a := r.lastAck(); a.Sequence != 2 || a.Status != manifest.AckApplied {
		t.Fatalf("ack %+v", a)
	}
	if j := r.poolJSON("cell-01"); strings.Contains(j, "m.example.com") {
		t.Errorf("cell-01 still holds the moved domain: %s", j)
	}
	if j := r.poolJSON("cell-03"); !strings.Contains(j, "m.example.com") || !strings.Contains(j, "m2") {
		t.Errorf("cell-03 lacks the moved domain's new revision: %s", j)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Refused placements change nothing: an entry for a pool no cell is in, an
// entry naming an unassigned or unknown cell, assignments of a cell this edge
// does not have.
func TestPlacementRefusals(t *testing.T) {
	r := newRig(t)
	r.serve(1, nil, r.entry("a.example.com", domain.PoolSharedDefault, 1, "a"))
	r.poll()
	before, _ := runtime.Current(r.slot("cell-01"))
	eu := &manifest.Assignments{
		Cells: map[string]string{"cell-01": domain.PoolSharedDefault, "cell-03": "reserved-eu"},
		Pools: map[string]manifest.PoolPolicy{domain.PoolSharedDefault: {Class: "shared"}, "reserved-eu": reservedEU},
	}
	tests := []struct {
		name string
		a    *manifest.Assignments
		e    func(seq int64) []manifest.Entry
		want string
	}{
		{"an entry for a pool with no cell here", nil, func(seq int64) []manifest.Entry {
			return []manifest.Entry{r.entry("r.example.com", "reserved-eu", seq, "r")}
		}, "is for pool reserved-eu"},
		{"an entry naming an unassigned cell", eu, func(seq int64) []manifest.Entry {
			return []manifest.Entry{r.entry("r.example.com", "reserved-eu", seq, "r", "cell-02", "cell-03")}
		}, "names cell-02, which is not assigned here"},
		{"an entry naming a cell this edge lacks", eu, func(seq int64) []manifest.Entry {
			return []manifest.Entry{r.entry("r.example.com", "reserved-eu", seq, "r", "cell-03", "cell-09")}
		}, "names cell-09, which is not a cell of this edge"},
		{"assignments of a cell this edge lacks", &manifest.Assignments{
			Cells: map[string]string{"cell-09": domain.PoolSharedDefault},
			Pools: map[string]manifest.PoolPolicy{domain.PoolSharedDefault: {Class: "shared"}},
		}, func(int64) []manifest.Entry { return nil }, "cell-09 is not a cell of this edge"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seq := int64(10 + i)
			r.serve(seq, tc.a, tc.e(seq)...)
			r.poll()
			if a := r.lastAck(); a.Sequence != seq || a.Status != manifest.AckRefused || !strings.Contains(a.Reason, tc.want) {
				t.Fatalf("ack %+v, want refused with %q", a, tc.want)
			}
			if now, _ := runtime.Current(r.slot("cell-01")); now.ID != before.ID {
				t.Error("cell-01's release changed")
			}
			if _, err := runtime.Current(r.slot("cell-03")); !errors.Is(err, runtime.ErrNoRelease) {
				t.Error("cell-03 got a release")
			}
			if got, _ := runtime.LoadOrCreateAssignments(r.state, r.topo); got["cell-03"] != "" {
				t.Errorf("assignments persisted from a refused manifest: %v", got)
			}
		})
	}
}

// An unassigned cell that cannot be stopped keeps its runtime and is named
// in a partial ack.
func TestUnassignedCellThatWillNotStopIsNamed(t *testing.T) {
	r := newRig(t)
	r.serve(1, nil, r.entry("a.example.com", domain.PoolSharedDefault, 1, "a"))
	r.poll()
	r.cells.stuck = "cell-02"
	r.serve(2, &manifest.Assignments{
		Cells: map[string]string{"cell-01": domain.PoolSharedDefault},
		Pools: map[string]manifest.PoolPolicy{domain.PoolSharedDefault: {Class: "shared"}},
	}, r.entry("a.example.com", domain.PoolSharedDefault, 1, "a"))
	r.poll()
	a := r.lastAck()
	if a.Status != manifest.AckPartial || strings.Join(a.Cells, ",") != "cell-02" || !strings.Contains(a.Reason, "could not be stopped") {
		t.Fatalf("ack %+v", a)
	}
	if _, err := runtime.Current(r.slot("cell-02")); err != nil {
		t.Errorf("cell-02 lost its runtime though its cell was not stopped: %v", err)
	}
}
