package activation

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/controlclient"
	"cellvisor/domain"
	"cellvisor/manifest"
	"cellvisor/runtime"
)

const edge = "edge-1"

// memSource serves one manifest from memory, and can fail.
type memSource struct {
	mu        sync.Mutex
	m         manifest.Manifest
	pageSize  int
	artifacts map[string][]byte
	fail      error
	acks      []manifest.Ack
	// ignoreAfter serves the manifest whatever the edge's active sequence,
	// as a misbehaving control plane would.
	ignoreAfter bool
	snapshot    []byte
	// snapshotErr, if set, is what opening the snapshot returns.
	snapshotErr error
	// sign, when set, signs the manifest's header as it is served, as the
	// control API does: the tests that tamper with entries test the
	// entries' own checks behind a valid header.
	sign      ed25519.PrivateKey
	rotations []manifest.Rotation
}

func (s *memSource) Page(_ context.Context, after int64, cursor string) (manifest.Page, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return manifest.Page{}, s.fail
	}
	if s.m.Sequence == 0 || (s.m.Sequence <= after && !s.ignoreAfter) {
		return manifest.Page{}, manifest.ErrNoChange
	}
	size := s.pageSize
	if size == 0 {
		size = manifest.MaxEntries
	}
	m := s.m
	if s.sign != nil {
		m = manifest.Sign(s.sign, m, s.rotations)
	}
	pages := manifest.Paginate(m, size)
	for i, p := range pages {
		if (i == 0 && cursor == "") || (i > 0 && pages[i-1].Next == cursor) {
			return p, nil
		}
	}
	return manifest.Page{}, errors.New("no such cursor")
}

func (s *memSource) Artifact(_ context.Context, sum string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.artifacts[sum]; ok {
		return d, nil
	}
	return nil, errors.New("no such artifact")
}

func (s *memSource) Snapshot(context.Context) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snapshotErr != nil {
		return nil, s.snapshotErr
	}
	if s.snapshot == nil {
		return nil, manifest.ErrNoChange
	}
	return io.NopCloser(bytes.NewReader(s.snapshot)), nil
}

func (s *memSource) Ack(_ context.Context, a manifest.Ack) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acks = append(s.acks, a)
	return nil
}

// fakeCells loads the switched release on Apply, unless told not to.
type fakeCells struct {
	topo     runtime.Topology
	mu       sync.Mutex
	loaded   map[string]int64
	reloads  []string
	deadCell string
	// pools is what Assign was told; stuck is a cell whose Assign("") never
	// sees it stop.
	pools map[string]string
	stuck string
	// hung is a cell whose status calls get no answer: Loaded returns only
	// when its context ends.
	hung string
	// runtimes are the cells' runtimes RuntimeOf tells; a cell not in it
	// runs none.
	runtimes map[string]manifest.CellRuntime
}

func (f *fakeCells) RuntimeOf(cell string) (string, bool, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.runtimes[cell]
	return r.Version, r.Superseded, ok
}

func (f *fakeCells) Assign(ctx context.Context, cell, pool string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pools == nil {
		f.pools = map[string]string{}
	}
	f.pools[cell] = pool
	if pool == "" {
		if cell == f.stuck {
			f.mu.Unlock()
			<-ctx.Done()
			f.mu.Lock()
			return ctx.Err()
		}
		delete(f.loaded, cell)
	}
	return nil
}

func (f *fakeCells) Apply(_ context.Context, cell string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloads = append(f.reloads, cell)
	s, _ := f.topo.Slot(cell)
	if m, err := runtime.Current(s); err == nil && cell != f.deadCell {
		f.loaded[cell] = m.Sequence
	}
	return "loaded", nil
}

func (f *fakeCells) Loaded(ctx context.Context, cell string) (int64, bool, error) {
	f.mu.Lock()
	if cell == f.hung && cell != "" {
		f.mu.Unlock()
		<-ctx.Done()
		return 0, false, ctx.Err()
	}
	defer f.mu.Unlock()
	if cell == f.deadCell {
		return 0, false, nil
	}
	seq, running := f.loaded[cell]
	return seq, running, nil
}

type rig struct {
	t     testing.TB
	pub   ed25519.PublicKey
	priv  ed25519.PrivateKey
	src   *memSource
	cells *fakeCells
	topo  runtime.Topology
	a     *Activator
	j     *controlclient.Journal
	state string
}

func newRig(t testing.TB) *rig {
	seed := sha256.Sum256([]byte(t.Name()))
	priv := ed25519.NewKeyFromSeed(seed[:])
	dir := t.TempDir()
	topo := runtime.Plan(runtime.Layout{Slots: 3, HTTPBase: 20000, HTTPSBase: 21000, StateDir: dir, RunDir: filepath.Join(dir, "run")})
	if err := topo.MakeDirs(); err != nil {
		t.Fatal(err)
	}
	j, err := controlclient.OpenJournal(filepath.Join(dir, "acks.journal"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, pub: priv.Public().(ed25519.PublicKey), priv: priv, topo: topo, j: j, state: dir,
		src:   &memSource{artifacts: map[string][]byte{}, sign: priv},
		cells: &fakeCells{topo: topo, loaded: map[string]int64{}}}
	r.a, err = New(Options{
		EdgeID: edge, PublicKey: r.pub, Source: r.src, Journal: j, Topology: topo,
		Assignments: runtime.InitialAssignments(topo), Cells: r.cells, StateDir: dir,
		ApplyTimeout: 300 * time.Millisecond,
		Render: func(s runtime.Slot, pool string, seq int64) runtime.RenderParams {
			return runtime.RenderParams{Slot: s, Pool: pool, Sequence: seq, WorkerConnections: 64, WorkerShutdownTimeout: 5,
				CacheMaxBytes: 1 << 20, RequestMaxBytes: 1 << 20}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func domainJSON(domain, pool string, rev int64, body string) []byte {
	return []byte(fmt.Sprintf(`{"domain":%q,"pool":%q,"revision":%d,"hostnames":[%q],"routes":[{"prefix":"/","respond":{"status":200,"body":%q}}]}`,
		domain, pool, rev, domain, body))
}

// publish makes seq the served manifest with the given domain bodies.
func (r *rig) publish(seq int64, domains map[string]string) {
	m := manifest.Manifest{EdgeID: edge, Sequence: seq}
	for d, body := range domains {
		pool := domain.PoolSharedDefault
		if strings.HasPrefix(d, "q.") {
			pool = domain.PoolQuarantineDefault
		}
		art := domainJSON(d, pool, seq, body)
		e := manifest.NewEntry(r.priv, edge, d, pool, seq, art)
		r.src.artifacts[e.SHA256] = art
		m.Entries = append(m.Entries, e)
	}
	r.src.mu.Lock()
	r.src.m = m
	r.src.mu.Unlock()
}

// keepRevision1 puts the quarantine domain back at its revision-1 artifact
// in the published manifest, so that its pool's content does not change.
func (r *rig) keepRevision1(name, body string) {
	for i, e := range r.src.m.Entries {
		if e.Domain == name {
			art := domainJSON(name, domain.PoolQuarantineDefault, 1, body)
			r.src.m.Entries[i] = manifest.NewEntry(r.priv, edge, name, domain.PoolQuarantineDefault, 1, art)
			r.src.artifacts[r.src.m.Entries[i].SHA256] = art
		}
	}
}

// signed is the served manifest with its header signed, for a snapshot.
func (r *rig) signed() manifest.Manifest {
	r.src.mu.Lock()
	defer r.src.mu.Unlock()
	return manifest.Sign(r.priv, r.src.m, nil)
}

func (r *rig) slot(name string) runtime.Slot {
	s, _ := r.topo.Slot(name)
	return s
}

func (r *rig) poolJSON(name string) string {
	s := r.slot(name)
	m, err := runtime.Current(s)
	if err != nil {
		return ""
	}
	b, _ := os.ReadFile(filepath.Join(s.RuntimeDir(), "current", "pools", m.Pool+".json"))
	return string(b)
}

func (r *rig) lastAck() manifest.Ack {
	p := r.j.Pending()
	if len(p) == 0 {
		r.t.Fatal("no ack journaled")
	}
	return p[len(p)-1]
}

func TestApplyReloadsOnlyChangedCellsAndAcks(t *testing.T) {
	r := newRig(t)
	r.publish(1, map[string]string{"a.example.com": "one", "q.example.com": "quarantined"})
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := r.lastAck(); a.Sequence != 1 || a.Status != manifest.AckApplied {
		t.Fatalf("ack %+v", a)
	}
	if r.a.Active() != 1 || !strings.Contains(r.poolJSON("cell-01"), "one") || !strings.Contains(r.poolJSON("cell-02"), "quarantined") {
		t.Fatalf("active %d; cell-01 %q", r.a.Active(), r.poolJSON("cell-01"))
	}
	if got := strings.Join(r.cells.reloads, ","); got != "cell-01,cell-02" {
		t.Errorf("reloaded %s, want cell-01,cell-02 (cell-03 is unassigned)", got)
	}
	// Sequence 2 changes only the shared-default domain.
	r.cells.reloads = nil
	r.publish(2, map[string]string{"a.example.com": "two", "q.example.com": "quarantined"})
	// The quarantine domain keeps its revision-1 artifact: same content.
	r.keepRevision1("q.example.com", "quarantined")
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.cells.reloads, ","); got != "cell-01" {
		t.Errorf("reloaded %q, want only cell-01", got)
	}
	if a := r.lastAck(); a.Sequence != 2 || a.Status != manifest.AckApplied || r.a.Active() != 2 {
		t.Fatalf("ack %+v active %d", a, r.a.Active())
	}
	// The active sequence survives a restart of the activator.
	again, err := New(r.a.o)
	if err != nil || again.Active() != 2 {
		t.Fatalf("after restart: active %d, %v", again.Active(), err)
	}
}

// Every bad input is refused with a reason, journaled as a refusal, and
// leaves the previous release active and untouched.
func TestRefusalsLeaveThePreviousReleaseActive(t *testing.T) {
	_, otherKey, _ := ed25519.GenerateKey(nil)
	tests := []struct {
		name   string
		mutate func(r *rig)
		reason string
	}{
		{"tampered artifact bytes", func(r *rig) {
			e := r.src.m.Entries[0]
			r.src.artifacts[e.SHA256] = bytes.Replace(r.src.artifacts[e.SHA256], []byte("two"), []byte("owt"), 1)
		}, "SHA-256 mismatch"},
		{"wrong size", func(r *rig) {
			e := &r.src.m.Entries[0]
			art := r.src.artifacts[e.SHA256]
			*e = manifest.NewEntry(r.priv, edge, e.Domain, e.Pool, e.Revision, art)
			e.Size++
			*e = resign(r.priv, *e)
		}, "size mismatch"},
		{"bad signature", func(r *rig) {
			e := &r.src.m.Entries[0]
			e.Signature = r.src.m.Entries[1].Signature
		}, "signature invalid"},
		{"missing signature", func(r *rig) { r.src.m.Entries[0].Signature = "" }, "signature"},
		{"signed by another key", func(r *rig) {
			e := &r.src.m.Entries[0]
			*e = resign(otherKey, *e)
		}, "not signed by the pinned control-plane key"},
		{"more than 500 entries in a page", func(r *rig) {
			for i := 0; len(r.src.m.Entries) <= 500; i++ {
				d := fmt.Sprintf("x%d.example.com", i)
				art := domainJSON(d, domain.PoolSharedDefault, 2, "x")
				e := manifest.NewEntry(r.priv, edge, d, domain.PoolSharedDefault, 2, art)
				r.src.artifacts[e.SHA256] = art
				r.src.m.Entries = append(r.src.m.Entries, e)
			}
			r.src.pageSize = 501
		}, "too many entries"},
		{"duplicate domains", func(r *rig) {
			r.src.m.Entries = append(r.src.m.Entries, r.src.m.Entries[0])
		}, "duplicate domain"},
		{"sequence going backwards", func(r *rig) { r.src.m.Sequence, r.src.ignoreAfter = 1, true }, "does not move forward"},
		{"malformed artifact JSON", func(r *rig) {
			art := []byte(`{"domain": "a.example.com", "pool": `)
			e := manifest.NewEntry(r.priv, edge, "a.example.com", domain.PoolSharedDefault, 2, art)
			r.src.artifacts[e.SHA256] = art
			r.src.m.Entries[0] = e
		}, "invalid domain configuration"},
		{"unknown pool", func(r *rig) {
			art := domainJSON("r.example.com", "reserved-eu", 2, "r")
			e := manifest.NewEntry(r.priv, edge, "r.example.com", "reserved-eu", 2, art)
			r.src.artifacts[e.SHA256] = art
			r.src.m.Entries = append(r.src.m.Entries, e)
		}, "pool not assigned on this edge"},
		{"invalid hostname", func(r *rig) {
			e := &r.src.m.Entries[0]
			e.Domain = "bad_host.example.com"
			*e = resign(r.priv, *e)
		}, "not a valid hostname"},
		{"artifact for another domain", func(r *rig) {
			art := domainJSON("evil.example.com", domain.PoolSharedDefault, 2, "x")
			e := manifest.NewEntry(r.priv, edge, "a.example.com", domain.PoolSharedDefault, 2, art)
			r.src.artifacts[e.SHA256] = art
			r.src.m.Entries[0] = e
		}, "artifact says evil.example.com"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.publish(1, map[string]string{"a.example.com": "one", "q.example.com": "q"})
			if err := r.a.Poll(context.Background()); err != nil {
				t.Fatal(err)
			}
			before := r.poolJSON("cell-01")
			r.cells.reloads = nil
			r.publish(2, map[string]string{"a.example.com": "two", "q.example.com": "q"})
			r.src.m.Entries = sortEntries(r.src.m.Entries)
			tc.mutate(r)
			if err := r.a.Poll(context.Background()); err != nil {
				t.Fatalf("a refusal is not an error to retry: %v", err)
			}
			a := r.lastAck()
			if a.Status != manifest.AckRefused || !strings.Contains(a.Reason, tc.reason) {
				t.Errorf("ack %+v, want refused with %q", a, tc.reason)
			}
			if r.a.Active() != 1 || r.poolJSON("cell-01") != before || len(r.cells.reloads) != 0 {
				t.Errorf("active %d, reloads %v, cell-01 changed %v: the previous release must stay", r.a.Active(), r.cells.reloads, r.poolJSON("cell-01") != before)
			}
			// Polling again does not refuse (and ack) the same sequence twice.
			n := len(r.j.Pending())
			r.a.Poll(context.Background())
			if len(r.j.Pending()) != n {
				t.Error("the same refused manifest was acknowledged again")
			}
		})
	}
}

func sortEntries(es []manifest.Entry) []manifest.Entry {
	out := append([]manifest.Entry(nil), es...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j].Domain < out[i].Domain {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// resign signs e (as it now is) with key.
func resign(key ed25519.PrivateKey, e manifest.Entry) manifest.Entry {
	sig := ed25519.Sign(key, manifest.SigningMessage(edge, e))
	e.Signature = encodeSig(sig)
	return e
}

func TestPartialAckNamesCellsThatDidNotLoad(t *testing.T) {
	r := newRig(t)
	r.cells.deadCell = "cell-02"
	r.publish(1, map[string]string{"a.example.com": "one", "q.example.com": "q"})
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := r.lastAck()
	if a.Status != manifest.AckPartial || len(a.Cells) != 1 || a.Cells[0] != "cell-02" {
		t.Errorf("ack %+v, want partial naming cell-02", a)
	}
	// cell-02 comes back but still runs its old configuration; the next
	// manifest leaves quarantine unchanged on disk, and still reloads and
	// awaits cell-02 instead of acking it as applied.
	r.cells.mu.Lock()
	r.cells.deadCell = ""
	r.cells.loaded["cell-02"] = 0
	r.cells.reloads = nil
	r.cells.mu.Unlock()
	r.publish(2, map[string]string{"a.example.com": "two", "q.example.com": "q"})
	r.keepRevision1("q.example.com", "q")
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := r.lastAck(); a.Sequence != 2 || a.Status != manifest.AckApplied {
		t.Errorf("ack %+v, want applied once cell-02 loaded its release", a)
	}
	if !slices.Contains(r.cells.reloads, "cell-02") {
		t.Errorf("reloads %v: the stale cell-02 was not reloaded", r.cells.reloads)
	}
}

func TestSourceDownIsRetriedNotAcked(t *testing.T) {
	r := newRig(t)
	r.publish(1, map[string]string{"a.example.com": "one"})
	r.src.fail = errors.New("connection refused")
	if err := r.a.Poll(context.Background()); err == nil {
		t.Fatal("want an error to retry")
	}
	if len(r.j.Pending()) != 0 || r.a.Active() != 0 {
		t.Error("an unreachable source produced an ack or an activation")
	}
}

// A new edge recovers from a full snapshot; a snapshot that is a gzip bomb,
// or signed by another key, is refused and changes nothing.
func TestRecoverySnapshot(t *testing.T) {
	r := newRig(t)
	r.publish(5, map[string]string{"a.example.com": "from snapshot"})
	var buf bytes.Buffer
	if err := manifest.WriteSnapshot(&buf, manifest.Snapshot{Manifest: r.signed(), Artifacts: r.src.artifacts}); err != nil {
		t.Fatal(err)
	}
	r.src.snapshot = buf.Bytes()
	r.src.m = manifest.Manifest{} // no pages: only the snapshot
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r.a.Active() != 5 || !strings.Contains(r.poolJSON("cell-01"), "from snapshot") {
		t.Fatalf("active %d after recovery", r.a.Active())
	}
	if a := r.lastAck(); a.Sequence != 5 || a.Status != manifest.AckApplied {
		t.Errorf("ack %+v", a)
	}

	bomb := newRig(t)
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "manifest.json", Typeflag: tar.TypeReg, Size: 100 << 20, Mode: 0o644})
	tw.Write(make([]byte, 100<<20))
	tw.Close()
	zw.Close()
	bomb.src.snapshot = z.Bytes()
	if err := bomb.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := bomb.lastAck(); a.Status != manifest.AckRefused || !strings.Contains(a.Reason, "over its bound") || bomb.a.Active() != 0 {
		t.Errorf("gzip bomb: ack %+v active %d", a, bomb.a.Active())
	}

	forged := newRig(t)
	forged.publish(5, map[string]string{"a.example.com": "forged"})
	_, other, _ := ed25519.GenerateKey(nil)
	for i, e := range forged.src.m.Entries {
		forged.src.m.Entries[i] = resign(other, e)
	}
	buf.Reset()
	manifest.WriteSnapshot(&buf, manifest.Snapshot{Manifest: forged.signed(), Artifacts: forged.src.artifacts})
	forged.src.snapshot, forged.src.m = buf.Bytes(), manifest.Manifest{}
	forged.a.Poll(context.Background())
	if a := forged.lastAck(); a.Status != manifest.AckRefused || forged.a.Active() != 0 || forged.poolJSON("cell-01") != "" {
		t.Errorf("forged snapshot: ack %+v active %d", a, forged.a.Active())
	}
}

// A spool that serves a bad page: refused once, with its sequence.
func TestBadSpoolPageRefusedOnceWithItsSequence(t *testing.T) {
	r := newRig(t)
	spool := controlclient.DirSource{Dir: t.TempDir()}
	r.a.o.Source = spool
	r.publish(7, map[string]string{"a.example.com": "one"})
	m := r.src.m
	m.Entries = append(m.Entries, m.Entries[0]) // a duplicate domain
	m = manifest.Sign(r.priv, m, nil)
	if err := spool.Publish(m, r.src.artifacts); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := r.a.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	p := r.j.Pending()
	if len(p) != 1 || p[0].Sequence != 7 || p[0].Status != manifest.AckRefused || !strings.Contains(p[0].Reason, "duplicate domain") {
		t.Errorf("acks %+v, want one refusal of sequence 7", p)
	}
}

// After a rollback at start the active sequence is rewound, and the next
// poll applies the newest manifest again.
func TestRewindReappliesTheNewestManifest(t *testing.T) {
	r := newRig(t)
	r.publish(1, map[string]string{"a.example.com": "one"})
	r.a.Poll(context.Background())
	r.publish(2, map[string]string{"a.example.com": "two"})
	r.a.Poll(context.Background())
	if err := r.a.Rewind(1); err != nil || r.a.Active() != 1 {
		t.Fatalf("rewind: %v, active %d", err, r.a.Active())
	}
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r.a.Active() != 2 || r.lastAck().Sequence != 2 {
		t.Errorf("active %d, last ack %+v: want 2 re-applied", r.a.Active(), r.lastAck())
	}
	if err := r.a.Rewind(5); err != nil || r.a.Active() != 2 {
		t.Errorf("a rewind forward moved the active sequence to %d", r.a.Active())
	}
}

// A new edge whose recovery snapshot the source will not serve now (busy,
// or the edge's share of the downloads taken: 503 or 429 from the control
// API, issue 32 §3) pages through the manifest in the same poll instead
// of waiting for a snapshot slot.
func TestSnapshotRefusedPagesTheManifest(t *testing.T) {
	r := newRig(t)
	r.publish(3, map[string]string{"a.example.com": "paged"})
	r.src.snapshotErr = fmt.Errorf("%w: control API: busy (HTTP 503)", manifest.ErrSnapshotBusy)
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatalf("poll with the snapshot refused: %v, want the manifest paged", err)
	}
	if r.a.Active() != 3 || !strings.Contains(r.poolJSON("cell-01"), "paged") {
		t.Fatalf("active %d after the snapshot was refused: want 3, paged", r.a.Active())
	}
	if a := r.lastAck(); a.Sequence != 3 || a.Status != manifest.AckApplied {
		t.Errorf("ack %+v, want 3 applied", a)
	}
}

// A first manifest with no entries (an edge whose pools hold no domains
// yet) is activated like any other, by pages and by a recovery snapshot:
// every assigned cell gets a release serving no domain (and so becomes
// ready rather than degraded for a missing runtime), the unassigned one
// none, and it is acknowledged as applied.
func TestEmptyManifestIsActivated(t *testing.T) {
	asg := &manifest.Assignments{
		Cells: map[string]string{"cell-01": domain.PoolSharedDefault, "cell-02": domain.PoolQuarantineDefault},
		Pools: map[string]manifest.PoolPolicy{domain.PoolSharedDefault: {Class: "shared"}, domain.PoolQuarantineDefault: {Class: "quarantine"}},
	}
	check := func(t *testing.T, r *rig) {
		t.Helper()
		if a := r.lastAck(); a.Sequence != 1 || a.Status != manifest.AckApplied || r.a.Active() != 1 {
			t.Fatalf("ack %+v, active %d; want sequence 1 applied", a, r.a.Active())
		}
		for _, c := range []string{"cell-01", "cell-02"} {
			m, err := runtime.Current(r.slot(c))
			if err != nil || m.Sequence != 1 {
				t.Fatalf("%s: release %+v, %v; want sequence 1", c, m, err)
			}
			if got, running, _ := r.cells.Loaded(context.Background(), c); !running || got != 1 {
				t.Errorf("%s loaded %d (running %v), want 1", c, got, running)
			}
			var rt struct{ Hosts map[string]any }
			if err := json.Unmarshal([]byte(r.poolJSON(c)), &rt); err != nil || rt.Hosts == nil || len(rt.Hosts) != 0 {
				t.Errorf("%s pool JSON %s (%v), want no domains", c, r.poolJSON(c), err)
			}
		}
		if _, err := runtime.Current(r.slot("cell-03")); !errors.Is(err, runtime.ErrNoRelease) {
			t.Errorf("cell-03 (unassigned) has a release: %v", err)
		}
	}
	t.Run("pages", func(t *testing.T) {
		r := newRig(t)
		r.serve(1, asg)
		r.poll()
		check(t, r)
	})
	t.Run("snapshot", func(t *testing.T) {
		r := newRig(t)
		r.serve(1, asg)
		var buf bytes.Buffer
		if err := manifest.WriteSnapshot(&buf, manifest.Snapshot{Manifest: r.signed(), Artifacts: map[string][]byte{}}); err != nil {
			t.Fatal(err)
		}
		r.src.snapshot = buf.Bytes()
		r.src.m = manifest.Manifest{} // no pages: only the snapshot
		r.poll()
		check(t, r)
	})
}

// An applied manifest's ack carries the runtime each running cell runs,
// superseded or not, in slot order; a version that is not one (what a
// binary printed) goes as unknown, so that the control API takes the ack.
func TestAckCarriesTheCellsRuntimes(t *testing.T) {
	r := newRig(t)
	r.cells.mu.Lock()
	r.cells.runtimes = map[string]manifest.CellRuntime{
		"cell-02": {Version: "nginx/1.22.2\x1b[31m"},
		"cell-01": {Version: "nginx/1.22.1", Superseded: true},
	}
	r.cells.mu.Unlock()
	r.publish(1, map[string]string{"a.example.com": "one"})
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := r.lastAck()
	want := []manifest.CellRuntime{{Cell: "cell-01", Version: "nginx/1.22.1", Superseded: true}, {Cell: "cell-02"}}
	if a.Status != manifest.AckApplied || !slices.Equal(a.Runtimes, want) {
		t.Fatalf("ack %+v, want it applied with runtimes %+v", a, want)
	}
	if err := manifest.CheckRuntimes(a.Runtimes); err != nil {
		t.Errorf("the ack's runtimes would be refused: %v", err)
	}
}
