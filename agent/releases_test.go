package agent

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"cellvisor/config"
	"cellvisor/runtime"
)

// standalone is a standalone agent's configuration and layout in a
// temporary directory: two slots, cell-01 assigned, one domain.
func standalone(t *testing.T) (config.Agent, runtime.Topology, runtime.Assignments) {
	t.Helper()
	cfg, topo, _ := standaloneSlots(t, 2)
	return cfg, topo, runtime.Assignments{"cell-01": "shared-default"}
}

// standaloneSlots is a standalone agent's directories with n slots, every
// one assigned to the pool of the one domain.
func standaloneSlots(t *testing.T, n int) (config.Agent, runtime.Topology, runtime.Assignments) {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.StateDir, cfg.RunDir, cfg.DomainsDir = filepath.Join(dir, "state"), filepath.Join(dir, "run"), filepath.Join(dir, "domains")
	if err := os.MkdirAll(cfg.DomainsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	setDomain(t, cfg, "hi")
	topo := runtime.Plan(runtime.Layout{Slots: n, HTTPBase: 10080, HTTPSBase: 10443, StateDir: cfg.StateDir, RunDir: cfg.RunDir})
	if err := topo.MakeDirs(); err != nil {
		t.Fatal(err)
	}
	assign := runtime.Assignments{}
	for _, sl := range topo.Slots {
		assign[sl.Name] = "shared-default"
	}
	return cfg, topo, assign
}

// setDomain writes the one domain, answering body.
func setDomain(t *testing.T, cfg config.Agent, body string) {
	t.Helper()
	doc := `{"domain":"app.test","pool":"shared-default","revision":1,"hostnames":["app.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"` + body + `"}}]}`
	if err := os.WriteFile(filepath.Join(cfg.DomainsDir, "app.json"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
}

// start is what New does with releases: verify, then build.
func start(t *testing.T, cfg config.Agent, topo runtime.Topology, assign runtime.Assignments, log *zap.Logger) runtime.ReleaseMeta {
	t.Helper()
	active, _ := verifyReleases(topo, assign, true, log)
	if err := buildStandalone(cfg, topo, assign, active, log); err != nil {
		t.Fatal(err)
	}
	m, _, err := runtime.VerifyCurrent(topo.Slots[0])
	if err != nil {
		t.Fatalf("the active release does not verify: %v", err)
	}
	return m
}

// A restart with the same domains keeps the active release; changed
// domains make a new one, of the next sequence.
func TestStandaloneBuildsOnlyWhatChanged(t *testing.T) {
	cfg, topo, assign := standalone(t)
	first := start(t, cfg, topo, assign, zap.NewNop())
	if again := start(t, cfg, topo, assign, zap.NewNop()); again.ID != first.ID {
		t.Errorf("same domains: active release %s, want %s kept", again.ID, first.ID)
	}
	setDomain(t, cfg, "changed")
	next := start(t, cfg, topo, assign, zap.NewNop())
	if next.Sequence != first.Sequence+1 || next.Digest == first.Digest {
		t.Errorf("changed domains: release %d (%s), want sequence %d with another digest", next.Sequence, next.Digest, first.Sequence+1)
	}
	if _, err := runtime.Current(topo.Slots[1]); err == nil {
		t.Error("an unassigned slot got a release")
	}
}

// countRenders counts the digest renders of the starts that follow, until
// the test ends. The renders of one start run one after the other.
func countRenders(t *testing.T) *int {
	renders := new(int)
	releaseDigest = func(p runtime.RenderParams, pool *runtime.PoolRuntime) (string, error) {
		*renders++
		return runtime.ReleaseDigest(p, pool)
	}
	t.Cleanup(func() { releaseDigest = runtime.ReleaseDigest })
	return renders
}

// A restart whose inputs are those the active release was made of keeps it
// without rendering anything; changed inputs, a changed configuration or
// an inputs record that does not match render the digest again, and keep
// or replace the release by it.
func TestStandaloneRendersNothingForTheSameInputs(t *testing.T) {
	cfg, topo, assign := standalone(t)
	renders := countRenders(t)
	first := start(t, cfg, topo, assign, zap.NewNop())
	record := filepath.Join(topo.Slots[0].RuntimeDir(), inputsFile)
	if rec := readInputs(topo.Slots[0]); rec.Release != first.ID || rec.Inputs == "" {
		t.Fatalf("inputs record after the first build: %+v, want release %s", rec, first.ID)
	}
	if again := start(t, cfg, topo, assign, zap.NewNop()); again.ID != first.ID || *renders != 0 {
		t.Fatalf("same inputs: release %s after %d renders, want %s kept after none", again.ID, *renders, first.ID)
	}

	if err := os.WriteFile(record, []byte(`{"release":"`+first.ID+`","inputs":"forged"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if again := start(t, cfg, topo, assign, zap.NewNop()); again.ID != first.ID || *renders != 1 {
		t.Fatalf("a record of other inputs: release %s after %d renders, want %s kept after one", again.ID, *renders, first.ID)
	}
	if rec := readInputs(topo.Slots[0]); rec.Inputs == "forged" {
		t.Fatal("the record was not written again")
	}
	start(t, cfg, topo, assign, zap.NewNop())
	if *renders != 1 {
		t.Fatalf("%d renders: the rewritten record was not trusted", *renders)
	}

	cfg.OpenResty.WorkerConnections++ // another configuration: another nginx.conf
	changed := start(t, cfg, topo, assign, zap.NewNop())
	if changed.ID == first.ID || *renders != 2 {
		t.Fatalf("changed configuration: release %s after %d renders, want a new one after two", changed.ID, *renders)
	}
	if rec := readInputs(topo.Slots[0]); rec.Release != changed.ID {
		t.Fatalf("inputs record names %s, want the new release %s", rec.Release, changed.ID)
	}
	setDomain(t, cfg, "changed")
	if next := start(t, cfg, topo, assign, zap.NewNop()); next.ID == changed.ID || next.Sequence != changed.Sequence+1 {
		t.Fatalf("changed domains: release %s, want the next one", next.ID)
	}
}

// A damaged active release is rolled back to the older intact one, and
// then, since it differs from the domains directory, replaced by a new one
// doing what the domains say; one with no intact older release is built
// anew rather than served damaged.
func TestStandaloneRebuildsADamagedRelease(t *testing.T) {
	cfg, topo, assign := standalone(t)
	s := topo.Slots[0]
	start(t, cfg, topo, assign, zap.NewNop())
	setDomain(t, cfg, "new")
	cur := start(t, cfg, topo, assign, zap.NewNop())
	damage := func() {
		t.Helper()
		if err := os.WriteFile(s.ConfPath(), []byte("damaged"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	damage()
	core, logs := observer.New(zap.DebugLevel)
	m := start(t, cfg, topo, assign, zap.New(core))
	// Rolled back to sequence 1, then rebuilt as sequence 2 again: the
	// damaged directory replaced whole (start verified it).
	if m.Digest != cur.Digest || m.Sequence != cur.Sequence {
		t.Errorf("after damage: release %d (%s), want the domains' (%s) at sequence %d", m.Sequence, m.Digest, cur.Digest, cur.Sequence)
	}
	if logs.FilterMessage("active release was damaged; rolled back").Len() != 1 {
		t.Errorf("no rollback logged: %v", logs.All())
	}

	// Now every release but the active one is gone or damaged too.
	for _, dir := range mustGlob(t, filepath.Join(s.RuntimeDir(), "releases", "*")) {
		if filepath.Base(dir) != m.ID {
			os.RemoveAll(dir)
		}
	}
	damage()
	core, logs = observer.New(zap.DebugLevel)
	r := start(t, cfg, topo, assign, zap.New(core))
	if r.Digest != m.Digest || r.Sequence != m.Sequence+1 {
		t.Errorf("damaged, nothing to roll back to: release %d (%s), want %d (%s)", r.Sequence, r.Digest, m.Sequence+1, m.Digest)
	}
	if logs.FilterMessage("no intact release; building it anew from domains_dir").Len() != 1 {
		t.Errorf("the rebuild is not logged: %v", logs.All())
	}
}

// Every slot's release is verified and built: each slot ends on its own
// release, and what verification reports (rollbacks, the sequence to
// rewind to) is gathered over all of them, in slot order.
func TestReleasesOfEverySlot(t *testing.T) {
	cfg, topo, assign := standaloneSlots(t, 8)
	start(t, cfg, topo, assign, zap.NewNop())
	setDomain(t, cfg, "new")
	start(t, cfg, topo, assign, zap.NewNop())
	ids := map[string]bool{}
	for _, sl := range topo.Slots {
		m, _, err := runtime.VerifyCurrent(sl)
		if err != nil || m.Sequence != 2 || m.Pool != "shared-default" {
			t.Fatalf("%s: release %d of %q (%v), want 2 of shared-default", sl.Name, m.Sequence, m.Pool, err)
		}
		if ids[m.ID] {
			t.Fatalf("%s shares release %s with another slot", sl.Name, m.ID)
		}
		ids[m.ID] = true
	}
	damaged := []string{"cell-06", "cell-03"}
	for _, name := range damaged {
		if err := os.WriteFile(topo.Slots[slices.IndexFunc(topo.Slots, func(s runtime.Slot) bool { return s.Name == name })].ConfPath(), []byte("damaged"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	core, logs := observer.New(zap.DebugLevel)
	active, rewind := verifyReleases(topo, assign, false, zap.New(core))
	if rewind != 1 {
		t.Errorf("rewind %d, want 1 (the release both damaged slots rolled back to)", rewind)
	}
	for _, sl := range topo.Slots {
		want := int64(2)
		if slices.Contains(damaged, sl.Name) {
			want = 1
		}
		if m, ok := active[sl.Name]; !ok || m.Sequence != want {
			t.Errorf("%s: active %+v, want sequence %d", sl.Name, m, want)
		}
	}
	var order []string
	for _, e := range logs.FilterMessage("active release was damaged; rolled back").All() {
		order = append(order, e.ContextMap()["cell"].(string))
	}
	if !slices.Equal(order, []string{"cell-03", "cell-06"}) {
		t.Errorf("rollbacks logged for %v, want [cell-03 cell-06]", order)
	}
}

// An enrolled agent (no domains directory) whose active release is damaged
// with no intact older one withdraws it, so that no cell starts on it, and
// rewinds the active sequence to the one before, so that the control
// plane's release is fetched and activated again; the damaged directory
// stays for whoever looks into it.
func TestEnrolledWithdrawsADamagedReleaseAndFetchesItAgain(t *testing.T) {
	cfg, topo, assign := standalone(t)
	s := topo.Slots[0]
	start(t, cfg, topo, assign, zap.NewNop())
	setDomain(t, cfg, "new")
	m := start(t, cfg, topo, assign, zap.NewNop()) // sequence 2; 1 kept
	verifyAll := func() (map[string]runtime.ReleaseMeta, int64, *observer.ObservedLogs) {
		t.Helper()
		core, logs := observer.New(zap.DebugLevel)
		active, rewind := verifyReleases(topo, assign, false, zap.New(core))
		return active, rewind, logs
	}
	if active, rewind, _ := verifyAll(); rewind != -1 || active[s.Name].ID != m.ID {
		t.Fatalf("intact releases: active %v, rewind %d; want %s and none (-1)", active, rewind, m.ID)
	}
	for _, dir := range mustGlob(t, filepath.Join(s.RuntimeDir(), "releases", "*")) {
		if filepath.Base(dir) != m.ID {
			os.RemoveAll(dir)
		}
	}
	if err := os.WriteFile(s.ConfPath(), []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	active, rewind, logs := verifyAll()
	if _, ok := active[s.Name]; ok {
		t.Errorf("the damaged release is reported intact: %v", active)
	}
	if rewind != m.Sequence-1 {
		t.Errorf("rewind %d, want %d: the damaged release's sequence fetched again", rewind, m.Sequence-1)
	}
	if _, err := runtime.Current(s); !errors.Is(err, runtime.ErrNoRelease) {
		t.Errorf("the damaged release is still active (%v): a cell would start on it", err)
	}
	if _, err := os.Stat(filepath.Join(s.RuntimeDir(), "releases", m.ID)); err != nil {
		t.Errorf("the damaged release's directory is gone: %v", err)
	}
	if logs.FilterMessage("no intact release; withdrawn, the cell waits for it to be fetched again").Len() != 1 {
		t.Errorf("the withdrawal is not logged: %v", logs.All())
	}
}

func mustGlob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// An inputs record that is a FIFO or over its bound is no record: the start
// neither waits on it nor trusts it, renders the digest once, and writes
// a regular record in its place.
func TestStandaloneInputsRecordFIFOOrHuge(t *testing.T) {
	cfg, topo, assign := standalone(t)
	renders := countRenders(t)
	first := start(t, cfg, topo, assign, zap.NewNop())
	record := filepath.Join(topo.Slots[0].RuntimeDir(), inputsFile)
	for i, damage := range []func() error{
		func() error { os.Remove(record); return syscall.Mkfifo(record, 0o600) },
		func() error { return os.WriteFile(record, make([]byte, 1<<20), 0o600) },
	} {
		if err := damage(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { // the start's own steps: t.Fatal belongs to the test's goroutine
			active, _ := verifyReleases(topo, assign, true, zap.NewNop())
			done <- buildStandalone(cfg, topo, assign, active, zap.NewNop())
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			m, err := runtime.Current(topo.Slots[0])
			if err != nil || m.ID != first.ID || *renders != i+1 {
				t.Fatalf("damaged record %d: release %s after %d renders, want %s kept after %d", i, m.ID, *renders, first.ID, i+1)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("damaged record %d: the start waits on it", i)
		}
		if fi, err := os.Lstat(record); err != nil || !fi.Mode().IsRegular() || fi.Size() > 4096 {
			t.Fatalf("damaged record %d: not replaced by a regular record (%v, %v)", i, fi, err)
		}
	}
}
