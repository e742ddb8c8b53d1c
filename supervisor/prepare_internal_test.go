package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/cgroup"
	"cellvisor/runtime"
	"cellvisor/testkit/testutil"
)

// stubManager is a v1 manager whose groups live in memory: it records
// which groups were made (Ensure) and removed (Delete).
type stubManager struct {
	cgroup.Manager
	mu       sync.Mutex
	existing []string
	ensured  []string
	deleted  []string
	read     []string // groups whose members were read
	failing  string   // Ensure of this name fails
	// prepare, when set, is called with a group's name as a start execs
	// its cell there (Group.Prepare).
	prepare func(name string)
}

func (m *stubManager) Mode() cgroup.Mode { return cgroup.ModeV1Hybrid }
func (m *stubManager) Reason() error     { return nil }

func (m *stubManager) List() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.existing), nil
}

func (m *stubManager) Ensure(name string, _ cgroup.Limits) (cgroup.Group, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ensured = append(m.ensured, name)
	if name == m.failing {
		return nil, errors.New("mkdir: permission denied")
	}
	if !slices.Contains(m.existing, name) {
		m.existing = append(m.existing, name)
	}
	return &stubManagedGroup{m: m, name: name}, nil
}

func (m *stubManager) Open(name string) (cgroup.Group, error) {
	return &stubManagedGroup{m: m, name: name}, nil
}

func (m *stubManager) made() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.ensured)
}

type stubManagedGroup struct {
	cgroup.Group
	m    *stubManager
	name string
}

func (g *stubManagedGroup) Name() string { return g.name }
func (g *stubManagedGroup) Procs() ([]int, error) {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	g.m.read = append(g.m.read, g.name)
	return nil, nil
}

func (g *stubManagedGroup) Prepare(*exec.Cmd) (func(bool), error) {
	if g.m.prepare != nil {
		g.m.prepare(g.name)
	}
	return nil, nil
}

func (g *stubManagedGroup) Delete(context.Context) error {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	g.m.deleted = append(g.m.deleted, g.name)
	return nil
}

func newPrepareSupervisor(t *testing.T, m cgroup.Manager, refusal error) *Supervisor {
	t.Helper()
	topo := runtime.Plan(runtime.Layout{Slots: 4, HTTPBase: 1000, HTTPSBase: 2000, StateDir: t.TempDir(), RunDir: t.TempDir()})
	assign := runtime.Assignments{"cell-01": "shared", "cell-02": "shared", "cell-04": "shared"} // cell-03 unassigned
	s, err := New(Options{Binary: "/bin/true", Topology: topo, Assignments: assign, Cgroups: m, Refusal: refusal})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Prepare makes the group of every assigned slot that has none, in slot
// order, and leaves alone an unassigned slot and a group that exists (a
// previous agent's, for recovery); the start pass then takes Prepare's
// groups as made, without making them again, and makes the others.
func TestPrepareMakesMissingGroupsOnceForTheStartPass(t *testing.T) {
	m := &stubManager{existing: []string{"cell-02"}}
	s := newPrepareSupervisor(t, m, nil)
	s.Prepare()
	starting := []*slot{s.slots[0], s.slots[1], s.slots[3]}
	made := make(chan *slot, len(starting))
	s.createGroups(starting, made)
	var order []string
	for c := range made {
		order = append(order, c.spec.Name)
		if c.group == nil || c.fresh == nil {
			t.Errorf("%s handed on without its group and fresh limits", c.spec.Name)
		}
	}
	if want := []string{"cell-01", "cell-02", "cell-04"}; !slices.Equal(order, want) {
		t.Errorf("start pass order %v, want %v", order, want)
	}
	got := m.made()
	slices.Sort(got)
	if want := []string{"cell-01", "cell-02", "cell-04"}; !slices.Equal(got, want) {
		t.Errorf("groups made %v, want each of %v once", got, want)
	}
	if s.slots[1].prepared != nil || s.slots[2].prepared != nil {
		t.Error("Prepare took an existing group or an unassigned slot")
	}
}

// A cell whose exec waits (its child not yet run by a busy host's
// scheduler) holds up that cell only: the start pass execs the cells after
// it meanwhile, and the waiting one once its exec goes on.
func TestStartPassGoesOnPastAWaitingExec(t *testing.T) {
	release := make(chan struct{})
	execd := make(chan string, 3)
	m := &stubManager{prepare: func(name string) {
		if name == "cell-01" {
			<-release
		}
		execd <- name
	}}
	s := newPrepareSupervisor(t, m, nil)
	if err := s.o.Topology.MakeDirs(); err != nil {
		t.Fatal(err)
	}
	starting := []*slot{s.slots[0], s.slots[1], s.slots[3]}
	passed := make(chan struct{})
	go func() {
		defer close(passed)
		s.startAll(starting)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var order []string
	for len(order) < 2 {
		select {
		case name := <-execd:
			order = append(order, name)
		case <-ctx.Done():
			close(release)
			select { // the pass ends once cell-01's exec goes on
			case <-passed:
			case <-time.After(10 * time.Second):
			}
			t.Fatalf("while cell-01's exec waited the pass exec'd %v, want [cell-02 cell-04]", order)
		}
	}
	close(release)
	select {
	case <-passed:
	case <-ctx.Done():
		t.Fatal("the start pass did not end once cell-01's exec went on")
	}
	if order = append(order, <-execd); !slices.Equal(order, []string{"cell-02", "cell-04", "cell-01"}) {
		t.Errorf("exec order %v, want [cell-02 cell-04 cell-01]", order)
	}
	for _, c := range starting {
		if c.started == nil {
			t.Errorf("%s not started by the pass", c.spec.Name)
			continue
		}
		select { // /bin/true: reaped by its start's own goroutine
		case <-c.started.done:
		case <-ctx.Done():
			t.Fatalf("%s's process was not reaped", c.spec.Name)
		}
	}
}

// A group Prepare made is one recovery need not read, made already or
// not: nothing of a previous agent's can run in it.
func TestRecoveryTrustsPreparedGroupsVacant(t *testing.T) {
	m := &stubManager{existing: []string{"cell-02"}}
	s := newPrepareSupervisor(t, m, nil)
	s.Prepare()
	<-s.slots[0].prepared
	s.recoverAll(context.Background())
	if !s.slots[0].vacant {
		t.Error("a prepared group was not trusted vacant")
	}
	if slices.Contains(m.read, "cell-01") || slices.Contains(m.read, "cell-04") {
		t.Errorf("recovery read prepared groups: %v", m.read)
	}
	if !slices.Contains(m.read, "cell-02") {
		t.Errorf("recovery did not read the existing group: %v", m.read)
	}
	s.startAll(nil)
	for _, c := range s.slots {
		if c.vacant {
			t.Errorf("%s still vacant after the start pass", c.spec.Name)
		}
	}
}

// A caller that prepared and does not run removes what Prepare made, and
// only that.
func TestUnprepareRemovesPreparedGroups(t *testing.T) {
	m := &stubManager{existing: []string{"cell-02"}, failing: "cell-04"}
	s := newPrepareSupervisor(t, m, nil)
	s.Prepare()
	s.Unprepare()
	if !slices.Equal(m.deleted, []string{"cell-01"}) {
		t.Errorf("removed %v, want [cell-01] (cell-04's failed, cell-02 is not Prepare's)", m.deleted)
	}
	if s.slots[0].group != nil {
		t.Error("the removed group is still the slot's")
	}
}

// Under a refusal Prepare makes nothing.
func TestPrepareMakesNothingUnderARefusal(t *testing.T) {
	m := &stubManager{}
	s := newPrepareSupervisor(t, m, errors.New("limits cannot be enforced"))
	s.Prepare()
	s.Unprepare()
	if got := m.made(); len(got) != 0 {
		t.Errorf("made %v under a refusal", got)
	}
}

// earlySupervisor is newPrepareSupervisor on free loopback ports, each
// slot's active release (its nginx.conf) listening on 127.0.0.1 but
// cell-04's, which has no release.
func earlySupervisor(t *testing.T, m cgroup.Manager, refusal error) *Supervisor {
	t.Helper()
	base := testutil.PortBase(t, 8)
	topo := runtime.Plan(runtime.Layout{Slots: 4, HTTPBase: base, HTTPSBase: base + 4,
		Address: "127.0.0.1", StateDir: t.TempDir(), RunDir: t.TempDir()})
	for _, sl := range topo.Slots[:3] {
		writeConf(t, sl, "127.0.0.1")
	}
	assign := runtime.Assignments{"cell-01": "shared", "cell-02": "shared", "cell-04": "shared"} // cell-03 unassigned
	s, err := New(Options{Binary: "/bin/true", Topology: topo, Assignments: assign, Cgroups: m, Refusal: refusal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range s.slots {
			if c.prepared != nil {
				<-c.prepared // Prepare's goroutine is done
			}
			c.dropEarly()
			if c.ln != nil {
				c.ln.close()
			}
		}
	})
	return s
}

// writeConf writes an nginx.conf listening on addr at sl's active release.
func writeConf(t *testing.T, sl runtime.Slot, addr string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(sl.ConfPath()), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("http {\n  server {\n    listen %[1]s:%[2]d;\n    listen %[1]s:%[3]d ssl;\n  }\n}\n", addr, sl.HTTPPort, sl.HTTPSPort)
	if err := os.WriteFile(sl.ConfPath(), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
}

// accepting reports whether 127.0.0.1:port accepts a connection.
func accepting(port int) bool { return dialOnce("127.0.0.1", port) == nil }

// dialOnce connects to ip:port once, and closes the connection.
func dialOnce(ip string, port int) error {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(port)), time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// Prepare binds the ports of every assigned slot with a release, so that a
// client's connection waits for the cell from then on; not an unassigned
// slot's, nor those of a slot without a release. The start takes them,
// and the start pass closes those no start took.
func TestPrepareBindsAssignedSlotsPortsAhead(t *testing.T) {
	s := earlySupervisor(t, &stubManager{}, nil)
	s.Prepare()
	for i, want := range []bool{true, true, false, false} {
		sl := s.slots[i].spec
		for _, port := range []int{sl.HTTPPort, sl.HTTPSPort} {
			if got := accepting(port); got != want {
				t.Errorf("%s port %d accepts: %v, want %v", sl.Name, port, got, want)
			}
		}
	}
	first := s.slots[0]
	early := first.early
	if err := first.holdListeners(); err != nil {
		t.Fatal(err)
	}
	if first.ln != early || first.early != nil {
		t.Error("the start did not take the listeners bound ahead")
	}
	// cell-02 does not start (as if adopted): the pass closes its ports.
	s.startAll(nil)
	if sl := s.slots[1].spec; accepting(sl.HTTPPort) || accepting(sl.HTTPSPort) {
		t.Errorf("%s: ports still accept after the start pass that did not start it", sl.Name)
	}
	if !accepting(first.spec.HTTPPort) {
		t.Error("the started slot's listeners were closed")
	}
}

// A start whose release listens elsewhere than the one bound ahead (the
// agent built another meanwhile) binds where its release says.
func TestEarlyListenersRebindForAnotherAddress(t *testing.T) {
	s := earlySupervisor(t, &stubManager{}, nil)
	s.Prepare()
	c := s.slots[0]
	early := c.early
	writeConf(t, c.spec, "127.0.0.2")
	if err := c.holdListeners(); err != nil {
		t.Fatal(err)
	}
	if c.ln == nil || c.ln == early || c.early != nil {
		t.Fatal("the start kept the listeners bound for the old address")
	}
	if accepting(c.spec.HTTPPort) {
		t.Error("127.0.0.1 still accepts: the old listeners were not closed")
	}
	if err := dialOnce("127.0.0.2", c.spec.HTTPPort); err != nil {
		t.Fatalf("the new address does not accept: %v", err)
	}
}

// Ports taken by something else (a previous agent's master, which
// recovery adopts) are left alone, quietly; a refusal binds nothing, and
// Unprepare closes what Prepare bound.
func TestEarlyListenersTakenRefusedUnprepared(t *testing.T) {
	s := earlySupervisor(t, &stubManager{}, nil)
	held, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(s.slots[0].spec.HTTPPort))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	s.Prepare()
	if s.slots[0].early != nil {
		t.Error("bound ahead although its port is taken")
	}
	if s.slots[1].early == nil {
		t.Fatal("cell-02 not bound ahead")
	}
	s.Unprepare()
	if sl := s.slots[1].spec; accepting(sl.HTTPPort) {
		t.Errorf("%s still accepts after Unprepare", sl.Name)
	}

	r := earlySupervisor(t, &stubManager{}, errors.New("limits cannot be enforced"))
	r.Prepare()
	for _, c := range r.slots {
		if c.early != nil || accepting(c.spec.HTTPPort) {
			t.Errorf("%s bound under a refusal", c.spec.Name)
		}
	}
}

// linkRelease makes sl's active release a release directory of sequence
// seq (its current link switched to it), listening on addr.
func linkRelease(t *testing.T, sl runtime.Slot, seq int64, addr string) string {
	t.Helper()
	id := fmt.Sprintf("%012d-%016x", seq, seq)
	dir := filepath.Join(sl.RuntimeDir(), "releases", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("http {\n  server {\n    listen %[1]s:%[2]d;\n    listen %[1]s:%[3]d ssl;\n  }\n}\n", addr, sl.HTTPPort, sl.HTTPSPort)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(sl.RuntimeDir(), "current")
	os.RemoveAll(link)
	if err := os.Symlink(filepath.Join("releases", id), link); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "nginx.conf")
}

// The first start on the release the ports were bound for takes them as
// they are: its nginx.conf is not read again (here it no longer parses,
// which a second read would take for a release that binds its own ports).
// A release switched to meanwhile (another sequence) is read for where it
// listens.
func TestEarlyListenersKeptForTheSameRelease(t *testing.T) {
	s := earlySupervisor(t, &stubManager{}, nil)
	c, d := s.slots[0], s.slots[1]
	for _, sl := range []*slot{c, d} {
		os.RemoveAll(filepath.Join(sl.spec.RuntimeDir(), "current"))
	}
	conf := linkRelease(t, c.spec, 1, "127.0.0.1")
	linkRelease(t, d.spec, 1, "127.0.0.1")
	s.Prepare()
	early := c.early
	if early == nil {
		t.Fatal("nothing bound ahead")
	}
	if err := os.WriteFile(conf, []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.holdListeners(); err != nil {
		t.Fatal(err)
	}
	if c.ln != early {
		t.Error("the start on the same release did not take the listeners bound ahead")
	}
	dEarly := d.early
	linkRelease(t, d.spec, 2, "127.0.0.2")
	if err := d.holdListeners(); err != nil {
		t.Fatal(err)
	}
	if d.ln == nil || d.ln == dEarly {
		t.Fatal("the start on another release kept the listeners bound for the first")
	}
	if err := dialOnce("127.0.0.2", d.spec.HTTPPort); err != nil {
		t.Fatalf("the new release's address does not accept: %v", err)
	}
}

// A release whose metadata says where it listens (every release the agent
// builds) is bound there without its nginx.conf being read: here that no
// longer parses once verified. One that listens on every address is bound
// on every address.
func TestEarlyListenersFromTheReleasesMetadata(t *testing.T) {
	s := earlySupervisor(t, &stubManager{}, nil)
	c, d := s.slots[0], s.slots[1]
	for i, tc := range []struct {
		sl      *slot
		address string
	}{{c, "127.0.0.1"}, {d, ""}} {
		os.RemoveAll(filepath.Join(tc.sl.spec.RuntimeDir(), "current"))
		if err := os.MkdirAll(filepath.Join(tc.sl.spec.RuntimeDir(), "releases"), 0o755); err != nil {
			t.Fatal(err)
		}
		r, err := runtime.BuildRelease(runtime.RenderParams{Slot: tc.sl.spec, Sequence: int64(i + 1), Address: tc.address, WorkerConnections: 64}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := runtime.Activate(tc.sl.spec, r); err != nil {
			t.Fatal(err)
		}
		if _, _, err := runtime.VerifyCurrent(tc.sl.spec); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(tc.sl.spec.ConfPath(), []byte("garbage\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s.Prepare()
	if c.early == nil || c.earlyAddr != "127.0.0.1" || c.earlySeq != 1 {
		t.Fatalf("cell-01 bound ahead at %q for sequence %d (%v), want 127.0.0.1 and 1", c.earlyAddr, c.earlySeq, c.early != nil)
	}
	if d.early == nil || d.earlyAddr != "" || d.earlySeq != 2 {
		t.Fatalf("cell-02 bound ahead at %q for sequence %d (%v), want every address and 2", d.earlyAddr, d.earlySeq, d.early != nil)
	}
	if !accepting(c.spec.HTTPPort) || !accepting(d.spec.HTTPSPort) {
		t.Error("the ports bound ahead do not accept")
	}
	if err := dialOnce("127.0.0.2", d.spec.HTTPPort); err != nil {
		t.Fatalf("cell-02 listens on every address, 127.0.0.2 does not accept: %v", err)
	}
}

// Metadata that does not say where the release listens in a form that can
// be bound (a host name, or a release.json altered by hand) is not trusted
// for it: the release's nginx.conf is read, as for a release without it.
func TestEarlyListenersFromAnUnusableListenReadTheConf(t *testing.T) {
	s := earlySupervisor(t, &stubManager{}, nil)
	c := s.slots[0]
	os.RemoveAll(filepath.Join(c.spec.RuntimeDir(), "current"))
	if err := os.MkdirAll(filepath.Join(c.spec.RuntimeDir(), "releases"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := runtime.BuildRelease(runtime.RenderParams{Slot: c.spec, Sequence: 1, Address: "127.0.0.1", WorkerConnections: 64}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runtime.Activate(c.spec, r); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(c.spec.RuntimeDir(), "current", "release.json")
	data, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	forged := strings.Replace(string(data), `"listen":"127.0.0.1"`, `"listen":"not-an-address"`, 1)
	if forged == string(data) {
		t.Fatal("release.json holds no listen address to alter")
	}
	if err := os.WriteFile(meta, []byte(forged), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, _, err := runtime.VerifyCurrent(c.spec); err != nil || m.Listen != "not-an-address" {
		t.Fatalf("verified %q (%v), want the altered listen", m.Listen, err)
	}
	s.Prepare()
	if c.early == nil || c.earlyAddr != "127.0.0.1" || c.earlySeq != 1 {
		t.Fatalf("bound ahead at %q for sequence %d (%v), want what nginx.conf says: 127.0.0.1, 1", c.earlyAddr, c.earlySeq, c.early != nil)
	}
}
