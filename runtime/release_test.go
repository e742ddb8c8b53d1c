package runtime

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/internal/buildid"
)

var update = flag.Bool("update", false, "rewrite golden files")

func testParams(s Slot, seq int64) RenderParams {
	return RenderParams{Slot: s, Pool: domain.PoolSharedDefault, Sequence: seq, Address: "127.0.0.1",
		Modules:           []string{"/usr/share/nginx/modules/ndk_http_module.so", "/usr/share/nginx/modules/ngx_http_lua_module.so"},
		WorkerConnections: 1024, WorkerShutdownTimeout: 30, CacheMaxBytes: 256 << 20, RequestMaxBytes: 64 << 20}
}

// TestRenderGolden pins the rendered nginx.conf: a cell with no pool limits
// and no cached domain (as before placement), and one with both.
func TestRenderGolden(t *testing.T) {
	s := Plan(Layout{Slots: 3, HTTPBase: 10080, HTTPSBase: 10443, StateDir: "/var/lib/cellvisor", RunDir: "/run/cellvisor"}).Slots[2]
	p := testParams(s, 7)
	p.ReleaseDir = "/var/lib/cellvisor/cells/cell-03/runtime/releases/000000000007"
	limited := p
	limited.Limits, limited.Cache = PoolLimits{MaxConns: 100, Rate: 50, Burst: 10}, true
	for golden, p := range map[string]RenderParams{
		"cell-03.nginx.conf.golden":              p,
		"cell-03-limits-cache.nginx.conf.golden": limited,
	} {
		t.Run(golden, func(t *testing.T) { checkGolden(t, p, filepath.Join("testdata", golden)) })
	}
}

func checkGolden(t *testing.T, p RenderParams, golden string) {
	got, err := RenderConf(p)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./runtime -update)", err)
	}
	if string(got) != string(want) {
		t.Errorf("rendered nginx.conf differs from %s (go test ./runtime -update to accept):\n%s", golden, got)
	}
}

func slotFor(t *testing.T) Slot {
	s := Plan(Layout{Slots: 1, HTTPBase: 1, HTTPSBase: 2, StateDir: t.TempDir(), RunDir: t.TempDir()}).Slots[0]
	if err := (Topology{Slots: []Slot{s}}).MakeDirs(); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestActivateSwitchesAtomicallyKeepsPreviousAndPrunes(t *testing.T) {
	s := slotFor(t)
	if _, err := Current(s); err != ErrNoRelease {
		t.Fatalf("fresh slot: %v, want ErrNoRelease", err)
	}
	pools := func(body string) *PoolRuntime {
		p, _ := CompilePools([]domain.Domain{{Domain: "a.test", Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{"a.test"},
			Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: body}}}}})
		return p[domain.PoolSharedDefault]
	}
	for i, body := range []string{"one", "two", "three"} {
		seq := int64(i + 1)
		r, err := BuildRelease(testParams(s, seq), pools(body))
		if err != nil {
			t.Fatal(err)
		}
		meta, changed, err := Activate(s, r)
		if err != nil || !changed || meta.Sequence != seq {
			t.Fatalf("activate %d: %+v %v %v", seq, meta, changed, err)
		}
		conf, err := os.ReadFile(s.ConfPath())
		if err != nil || !strings.Contains(string(conf), "releases/"+r.Meta.ID) || !strings.HasPrefix(r.Meta.ID, fmt.Sprintf("%012d-", seq)) {
			t.Fatalf("current nginx.conf is not release %d: %v", seq, err)
		}
		pool, _ := os.ReadFile(filepath.Join(s.RuntimeDir(), "current", "pools", domain.PoolSharedDefault+".json"))
		if !strings.Contains(string(pool), body) {
			t.Fatalf("pool json of release %d lacks %q", seq, body)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(s.RuntimeDir(), releasesDir))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 2 || !strings.HasPrefix(names[0], fmt.Sprintf("%012d-", 2)) || !strings.HasPrefix(names[1], fmt.Sprintf("%012d-", 3)) {
		t.Errorf("releases kept: %v, want the previous and the current", names)
	}
	link, err := os.Readlink(filepath.Join(s.RuntimeDir(), currentLink))
	if cur, _ := Current(s); err != nil || link != filepath.Join(releasesDir, cur.ID) || cur.Sequence != 3 {
		t.Errorf("current -> %q %v", link, err)
	}
	// Same content again: nothing changes.
	r, _ := BuildRelease(testParams(s, 4), pools("three"))
	if _, changed, err := Activate(s, r); err != nil || changed {
		t.Errorf("identical content: changed=%v err=%v, want no new release", changed, err)
	}
	// Sequences never go backwards; the active release stays.
	r, _ = BuildRelease(testParams(s, 2), pools("back"))
	if _, _, err := Activate(s, r); err == nil || !strings.Contains(err.Error(), "never go backwards") {
		t.Errorf("backwards sequence: %v", err)
	}
	if cur, _ := Current(s); cur.Sequence != 3 {
		t.Errorf("active sequence %d after a refused activation, want 3", cur.Sequence)
	}
}

func TestInstallReplacesALeftoverFromACrashedInstall(t *testing.T) {
	s := slotFor(t)
	r, _ := BuildRelease(testParams(s, 1), nil)
	stale := filepath.Join(s.RuntimeDir(), releasesDir, r.Meta.ID)
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(stale, "nginx.conf"), []byte("half written"), 0o644)
	if _, _, err := Activate(s, r); err != nil {
		t.Fatal(err)
	}
	if conf, _ := os.ReadFile(s.ConfPath()); strings.Contains(string(conf), "half written") {
		t.Error("the crashed install's file survived")
	}
}

func TestVerifyCurrentRollsBackFromADamagedRelease(t *testing.T) {
	s := slotFor(t)
	for seq := int64(1); seq <= 2; seq++ {
		r, _ := BuildRelease(testParams(s, seq), &PoolRuntime{Pool: domain.PoolSharedDefault, Hosts: map[string]*domain.Domain{
			"a.test": {Domain: "a.test", Revision: seq}}})
		if _, _, err := Activate(s, r); err != nil {
			t.Fatal(err)
		}
	}
	if m, rolled, err := VerifyCurrent(s); err != nil || rolled || m.Sequence != 2 {
		t.Fatalf("intact: %+v rolled=%v %v", m, rolled, err)
	}
	// Damage the active release's pool file.
	pool := filepath.Join(s.RuntimeDir(), "current", "pools", domain.PoolSharedDefault+".json")
	if err := os.WriteFile(pool, []byte(`{"hosts":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	m, rolled, err := VerifyCurrent(s)
	if err != nil || !rolled || m.Sequence != 1 {
		t.Fatalf("damaged: %+v rolled=%v %v, want a rollback to 1", m, rolled, err)
	}
	if cur, _ := Current(s); cur.Sequence != 1 {
		t.Errorf("current is %d after the rollback", cur.Sequence)
	}
	// Nothing intact left: an error, nothing switched.
	os.WriteFile(filepath.Join(s.RuntimeDir(), "current", "nginx.conf"), []byte("x"), 0o644)
	if _, _, err := VerifyCurrent(s); err == nil {
		t.Error("no intact release: want an error")
	}
}

// Two releases of one sequence (the configuration changed, or an install
// was interrupted) get their own directories: the active one is never
// overwritten, and switching between them works.
func TestSameSequenceDifferentContent(t *testing.T) {
	s := slotFor(t)
	a, _ := BuildRelease(testParams(s, 4), nil)
	p := testParams(s, 4)
	p.WorkerConnections = 2048 // a configuration change
	b, _ := BuildRelease(p, nil)
	if a.Meta.ID == b.Meta.ID {
		t.Fatal("different content, same release id")
	}
	for _, r := range []Release{a, b} {
		if _, err := Install(s, r); err != nil {
			t.Fatal(err)
		}
		if err := Switch(s, r.Meta.ID); err != nil {
			t.Fatal(err)
		}
		if cur, _ := Current(s); cur.ID != r.Meta.ID {
			t.Fatalf("current %s, want %s", cur.ID, r.Meta.ID)
		}
	}
	if _, err := Install(s, b); err == nil {
		t.Error("installing over the active release: want a refusal")
	}
}

// A current release whose release.json is gone is damaged, not absent.
func TestMissingReleaseJSONRollsBack(t *testing.T) {
	s := slotFor(t)
	for seq := int64(1); seq <= 2; seq++ {
		r, _ := BuildRelease(testParams(s, seq), &PoolRuntime{Pool: domain.PoolSharedDefault, Hosts: map[string]*domain.Domain{"a.test": {Domain: "a.test", Revision: seq}}})
		if _, _, err := Activate(s, r); err != nil {
			t.Fatal(err)
		}
	}
	os.Remove(filepath.Join(s.RuntimeDir(), "current", metaFile))
	m, rolled, err := VerifyCurrent(s)
	if err != nil || !rolled || m.Sequence != 1 {
		t.Fatalf("%+v rolled=%v %v, want a rollback to 1", m, rolled, err)
	}
}

// ReleaseDigest is the digest BuildRelease gives, whatever the sequence,
// without rendering the release: what a start compares with the active one.
func TestReleaseDigestIsBuildReleases(t *testing.T) {
	s := slotFor(t)
	pool := &PoolRuntime{Pool: domain.PoolSharedDefault, Hosts: map[string]*domain.Domain{"a.test": {Domain: "a.test", Revision: 3, Cache: &domain.Cache{TTLSeconds: 60}}}}
	for _, pl := range []*PoolRuntime{nil, pool} {
		r, err := BuildRelease(testParams(s, 5), pl)
		if err != nil {
			t.Fatal(err)
		}
		for _, seq := range []int64{1, 5, 9} {
			if d, err := ReleaseDigest(testParams(s, seq), pl); err != nil || d != r.Meta.Digest {
				t.Errorf("sequence %d: digest %s (%v), want %s", seq, d, err, r.Meta.Digest)
			}
		}
	}
	other := testParams(s, 5)
	other.WorkerConnections++
	if d, _ := ReleaseDigest(other, pool); d == "" || d == mustBuild(t, testParams(s, 5), pool).Meta.Digest {
		t.Error("a changed parameter left the digest as it was")
	}
}

func mustBuild(t *testing.T, p RenderParams, pool *PoolRuntime) Release {
	t.Helper()
	r, err := BuildRelease(p, pool)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Replace installs a release doing what the active one does (which
// Activate would keep): for an active release found damaged. It refuses a
// sequence that goes backwards, read from the active directory's name.
func TestReplaceInstallsTheSameContentAnew(t *testing.T) {
	s := slotFor(t)
	if _, _, err := Activate(s, mustBuild(t, testParams(s, 3), nil)); err != nil {
		t.Fatal(err)
	}
	if n, ok := CurrentSequence(s); !ok || n != 3 {
		t.Fatalf("CurrentSequence %d %v, want 3", n, ok)
	}
	os.Remove(filepath.Join(s.RuntimeDir(), currentLink, metaFile)) // its release.json lost
	if _, _, err := Replace(s, mustBuild(t, testParams(s, 3), nil)); err == nil || !strings.Contains(err.Error(), "never go backwards") {
		t.Errorf("replace at the damaged release's own sequence: %v", err)
	}
	m, changed, err := Replace(s, mustBuild(t, testParams(s, 4), nil))
	if err != nil || !changed {
		t.Fatalf("replace: changed=%v err=%v", changed, err)
	}
	if v, _, err := VerifyCurrent(s); err != nil || v.ID != m.ID {
		t.Errorf("active after replace: %s (%v), want %s intact", v.ID, err, m.ID)
	}
}

// A start verifies its releases before anything else reads them: one whose
// file became a FIFO, a link or its release.json a FIFO is damaged, found
// so at once (never waiting for a writer) and rolled back from.
func TestVerifyCurrentRefusesFIFOsAndLinksWithoutWaiting(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string)
	}{
		{"nginx.conf a FIFO", func(t *testing.T, dir string) { fifo(t, filepath.Join(dir, "nginx.conf")) }},
		{"release.json a FIFO", func(t *testing.T, dir string) { fifo(t, filepath.Join(dir, metaFile)) }},
		{"nginx.conf a link", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "nginx.conf")
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			other := filepath.Join(t.TempDir(), "nginx.conf")
			if err := os.WriteFile(other, data, 0o644); err != nil {
				t.Fatal(err)
			}
			os.Remove(p)
			if err := os.Symlink(other, p); err != nil { // the same content, through a link
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := slotFor(t)
			old := mustBuild(t, testParams(s, 1), nil)
			if _, _, err := Activate(s, old); err != nil {
				t.Fatal(err)
			}
			p := testParams(s, 2)
			p.WorkerConnections++
			if _, _, err := Activate(s, mustBuild(t, p, nil)); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, filepath.Join(s.RuntimeDir(), currentLink))
			type result struct {
				m          ReleaseMeta
				rolledBack bool
				err        error
			}
			done := make(chan result, 1)
			go func() {
				m, rb, err := VerifyCurrent(s)
				done <- result{m, rb, err}
			}()
			select {
			case r := <-done:
				if r.err != nil || !r.rolledBack || r.m.ID != old.Meta.ID {
					t.Errorf("verify: %s rolled back %v (%v), want a roll back to %s", r.m.ID, r.rolledBack, r.err, old.Meta.ID)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("verification waits on the damaged release") // the FIFO's goroutine is stuck: the test binary ends
			}
		})
	}
}

func fifo(t *testing.T, path string) {
	t.Helper()
	os.Remove(path)
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Current answers from what was last read or verified while the slot's
// current link still names that release, and reads again once it names
// another: a start reads each release.json once.
func TestCurrentReadsEachActiveReleaseOnce(t *testing.T) {
	s := slotFor(t)
	first := mustBuild(t, testParams(s, 1), nil)
	if _, _, err := Activate(s, first); err != nil {
		t.Fatal(err)
	}
	if _, _, err := VerifyCurrent(s); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(s.RuntimeDir(), currentLink, metaFile)
	if err := os.WriteFile(meta, []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Current(s)
	if err != nil || m.ID != first.Meta.ID {
		t.Fatalf("Current after verification: %s, %v; want %s without reading release.json again", m.ID, err, first.Meta.ID)
	}
	for name := range m.Files {
		m.Files[name] = "changed by a caller"
	}
	if again, _ := Current(s); again.Files["nginx.conf"] != first.Meta.Files["nginx.conf"] {
		t.Fatal("a caller's change to Files reached the next caller")
	}
	second := mustBuild(t, testParams(s, 2), &PoolRuntime{Pool: domain.PoolSharedDefault, Hosts: map[string]*domain.Domain{"b.test": {Domain: "b.test", Revision: 1}}})
	if _, _, err := Activate(s, second); err != nil {
		t.Fatal(err)
	}
	if m, err := Current(s); err != nil || m.ID != second.Meta.ID {
		t.Fatalf("Current after a switch: %s, %v; want %s", m.ID, err, second.Meta.ID)
	}
	if err := Withdraw(s); err != nil {
		t.Fatal(err)
	}
	if _, err := Current(s); !errors.Is(err, ErrNoRelease) {
		t.Fatalf("Current after a withdrawal: %v, want ErrNoRelease", err)
	}
}

// ReleaseInputs is the same for every sequence of the same parameters,
// pool and build, and changes with any of them; a build without an ID
// has none.
func TestReleaseInputsCoverParametersPoolAndBuild(t *testing.T) {
	s := slotFor(t)
	pool := func(rev int64) *PoolRuntime {
		return &PoolRuntime{Pool: domain.PoolSharedDefault, Hosts: map[string]*domain.Domain{"a.test": {Domain: "a.test", Revision: rev}}}
	}
	inputs := func(p RenderParams, pl *PoolRuntime) string {
		t.Helper()
		in, err := ReleaseInputs(p, pl)
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	base := inputs(testParams(s, 1), pool(1))
	if base == "" || inputs(testParams(s, 7), pool(1)) != base {
		t.Fatalf("inputs %q, and another for another sequence", base)
	}
	other := testParams(s, 1)
	other.WorkerConnections++
	for name, in := range map[string]string{
		"a parameter": inputs(other, pool(1)),
		"the pool":    inputs(testParams(s, 1), pool(2)),
		"no pool":     inputs(testParams(s, 1), nil),
	} {
		if in == base {
			t.Errorf("%s changed, the inputs did not", name)
		}
	}
	t.Cleanup(func() { buildID = buildid.Self })
	buildID = func() string { return "another build" }
	if inputs(testParams(s, 1), pool(1)) == base {
		t.Error("another build, the same inputs")
	}
	buildID = func() string { return "" }
	if in := inputs(testParams(s, 1), pool(1)); in != "" {
		t.Errorf("a build without an ID has inputs %q", in)
	}
}

// A release is readable by anyone who may reach it, whatever the agent's
// umask (the unit's is 0027): a cell of its slot's own user reads it as
// "other".
func TestInstallIsReadableWhateverTheUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	s := slotFor(t)
	r, _ := BuildRelease(testParams(s, 1), &PoolRuntime{Pool: domain.PoolSharedDefault, Hosts: map[string]*domain.Domain{
		"a.test": {Domain: "a.test", Revision: 1}}})
	if _, _, err := Activate(s, r); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.RuntimeDir(), releasesDir, r.Meta.ID)
	n := 0
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o644)
		if e.IsDir() {
			want = 0o755
		}
		if info.Mode().Perm() != want {
			t.Errorf("%s is %v, want %v", path, info.Mode().Perm(), want)
		}
		n++
		return nil
	})
	if err != nil || n < 4 {
		t.Fatalf("walked %d entries: %v", n, err)
	}
}

// The shape is what a release does but for its data: a data change keeps
// it (the running cell loads the release), a configuration change or the
// cache zone appearing changes it (a reload), and data over what a cell
// reads is refused before anything is written.
func TestShapeSeparatesDataFromConfiguration(t *testing.T) {
	s := slotFor(t)
	pool := func(body string, ttl int) *PoolRuntime {
		d := domain.Domain{Domain: "a.test", Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{"a.test"},
			Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: body}}}}
		if ttl > 0 {
			d.Origins = []domain.Origin{{Name: "o", URL: "http://127.0.0.1:9"}}
			d.Routes = append(d.Routes, domain.Route{Prefix: "/o", Origin: "o"})
			d.Cache = &domain.Cache{TTLSeconds: ttl}
		}
		pools, err := CompilePools([]domain.Domain{d})
		if err != nil {
			t.Fatal(err)
		}
		return pools[domain.PoolSharedDefault]
	}
	build := func(p RenderParams, pr *PoolRuntime) ReleaseMeta {
		t.Helper()
		r, err := BuildRelease(p, pr)
		if err != nil {
			t.Fatal(err)
		}
		return r.Meta
	}
	base := build(testParams(s, 1), pool("one", 60))
	if base.Shape == "" || base.Shape == base.Digest {
		t.Fatalf("shape %q, digest %q: want a shape apart from the digest", base.Shape, base.Digest)
	}
	if m := build(testParams(s, 2), pool("two", 600)); m.Shape != base.Shape || m.Digest == base.Digest {
		t.Errorf("a body and a TTL changed: shape %v, digest %v; want the same shape, another digest", m.Shape == base.Shape, m.Digest == base.Digest)
	}
	limited := testParams(s, 2)
	limited.Limits = PoolLimits{MaxConns: 100}
	if m := build(limited, pool("one", 60)); m.Shape == base.Shape {
		t.Error("pool limits changed: the same shape")
	}
	if m := build(testParams(s, 2), pool("one", 0)); m.Shape == base.Shape {
		t.Error("the cache zone gone: the same shape")
	}
	// A certificate's key is data too: a key the activation opened (the
	// same documents) is another release of the same shape, and the key
	// is in the keys file, nowhere else.
	keyed := pool("one", 60)
	keyed.Hosts["a.test"].TLS = &domain.TLS{Certificate: "a", Chain: "c", Fingerprint: "f"}
	keyed.Keys = map[string][]byte{"a.test": []byte("-----BEGIN PRIVATE KEY-----\nk3y-material\n")}
	r, err := BuildRelease(testParams(s, 2), keyed)
	if err != nil {
		t.Fatal(err)
	}
	if r.Meta.Shape != base.Shape || r.Meta.Digest == base.Digest {
		t.Errorf("a key opened: shape %v, digest %v; want the same shape, another digest", r.Meta.Shape == base.Shape, r.Meta.Digest == base.Digest)
	}
	for name, data := range r.Files {
		if strings.Contains(string(data), "k3y-material") != (name == keysFile) {
			t.Errorf("%s: holds the key %v", name, strings.Contains(string(data), "k3y-material"))
		}
	}
	small := testParams(s, 2)
	small.MaxDataBytes = 100
	if _, err := BuildRelease(small, pool("one", 60)); !errors.Is(err, ErrTooBig) || !strings.Contains(err.Error(), "more than a cell reads (100)") {
		t.Errorf("data over the cell's bound: %v, want ErrTooBig with the sizes", err)
	}
}

// The cell loads its CA bundle for its Lua only where a domain has an
// active health check of https servers: each location parses the bundle
// again (a quarter of a second at every start and reload).
func TestCABundleForChecksOnlyWhereNeeded(t *testing.T) {
	s := slotFor(t)
	build := func(o domain.Origin) string {
		t.Helper()
		d := domain.Domain{Domain: "a.test", Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{"a.test"},
			Origins: []domain.Origin{o}, Routes: []domain.Route{{Prefix: "/", Origin: o.Name}}}
		pools, err := CompilePools([]domain.Domain{d})
		if err != nil {
			t.Fatal(err)
		}
		p := testParams(s, 1)
		p.OriginCAFile = "/etc/ssl/certs/ca-certificates.crt"
		r, err := BuildRelease(p, pools[domain.PoolSharedDefault])
		if err != nil {
			t.Fatal(err)
		}
		return string(r.Files["nginx.conf"])
	}
	hc := &domain.HealthCheck{Path: "/healthz"}
	for _, tc := range []struct {
		o    domain.Origin
		want bool
	}{
		{domain.Origin{Name: "o", URL: "https://app.test", HealthCheck: hc}, true},
		{domain.Origin{Name: "o", URL: "http://127.0.0.1:9", HealthCheck: hc}, false},
		{domain.Origin{Name: "o", URL: "https://app.test"}, false},
	} {
		if got := strings.Contains(build(tc.o), "lua_ssl_trusted_certificate"); got != tc.want {
			t.Errorf("%s with a check %v: lua_ssl_trusted_certificate %v, want %v", tc.o.URL, tc.o.HealthCheck != nil, got, tc.want)
		}
	}
}
