package runtime

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"cellvisor/domain"
)

func layout(t *testing.T, slots, httpBase, httpsBase int) Layout {
	dir := t.TempDir()
	return Layout{Slots: slots, HTTPBase: httpBase, HTTPSBase: httpsBase, Address: "127.0.0.1",
		StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run")}
}

// freeBase finds 2n free consecutive loopback ports.
func freeBase(t *testing.T, n int) int {
	for base := 10000 + os.Getpid()%(EphemeralLow()-10000-n); base < EphemeralLow()-n; base += n + 7 {
		ok := true
		for p := base; p < base+n && ok; p++ {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				continue
			}
			ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free ports")
	return 0
}

func TestPlanGivesEachSlotUniquePortsAndPaths(t *testing.T) {
	topo := Plan(Layout{Slots: 32, HTTPBase: 10080, HTTPSBase: 10443, StateDir: "/s", RunDir: "/r"})
	if err := topo.Check(); err != nil {
		t.Fatal(err)
	}
	s := topo.Slots[7]
	if s.Name != "cell-08" || s.HTTPPort != 10087 || s.HTTPSPort != 10450 || s.Dir != "/s/cells/cell-08" || s.PrivateSocket() != "/r/cell-08/private.sock" {
		t.Errorf("slot 8: %+v", s)
	}
}

func TestCheckRefusesCollisions(t *testing.T) {
	topo := Plan(Layout{Slots: 4, HTTPBase: 8000, HTTPSBase: 8002, StateDir: "/s", RunDir: "/r"})
	if err := topo.Check(); !errors.Is(err, ErrCollision) {
		t.Errorf("overlapping port ranges: %v, want ErrCollision", err)
	}
	topo = Plan(Layout{Slots: 2, HTTPBase: 8000, HTTPSBase: 9000, StateDir: "/x", RunDir: "/x/cells"})
	topo.Slots[1].RunDir = topo.Slots[0].Dir
	if err := topo.Check(); !errors.Is(err, ErrCollision) {
		t.Errorf("shared path: %v, want ErrCollision", err)
	}
}

func TestTopologyIsPersistedOnceAndNeverChanges(t *testing.T) {
	base := freeBase(t, 16)
	l := layout(t, 8, base, base+8)
	topo, created, err := LoadOrCreate(l)
	if err != nil || !created {
		t.Fatalf("create: %v created=%v", err, created)
	}
	for _, d := range []string{topo.Slots[0].RequestTmpDir(), topo.Slots[7].LogsDir(), topo.Slots[3].CacheDir()} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			t.Errorf("slot dir %s: %v", d, err)
		}
	}
	again, created, err := LoadOrCreate(l)
	if err != nil || created || len(again.Slots) != 8 || !again.CreatedAt.Equal(topo.CreatedAt) {
		t.Fatalf("reload: %v created=%v", err, created)
	}
	before, _ := os.ReadFile(filepath.Join(l.StateDir, topologyFile))
	for name, change := range map[string]func(Layout) Layout{
		"slot count": func(l Layout) Layout { l.Slots = 4; return l },
		"ports":      func(l Layout) Layout { l.HTTPBase++; return l },
		"paths":      func(l Layout) Layout { l.RunDir += "-other"; return l },
	} {
		if _, _, err := LoadOrCreate(change(l)); !errors.Is(err, ErrTopologyChanged) {
			t.Errorf("changed %s: %v, want ErrTopologyChanged", name, err)
		}
	}
	after, _ := os.ReadFile(filepath.Join(l.StateDir, topologyFile))
	if string(before) != string(after) {
		t.Error("a refused change modified the persisted topology")
	}
}

func TestCreateRefusesAPortInUse(t *testing.T) {
	base := freeBase(t, 4)
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+1))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := layout(t, 2, base, base+2)
	if _, _, err := LoadOrCreate(l); !errors.Is(err, ErrCollision) {
		t.Fatalf("port in use: %v, want ErrCollision", err)
	}
	if _, err := os.Stat(filepath.Join(l.StateDir, topologyFile)); !os.IsNotExist(err) {
		t.Error("a refused topology was persisted")
	}
}

func TestAssignments(t *testing.T) {
	base := freeBase(t, 8)
	l := layout(t, 4, base, base+4)
	topo, _, err := LoadOrCreate(l)
	if err != nil {
		t.Fatal(err)
	}
	a, err := LoadOrCreateAssignments(l.StateDir, topo)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 2 || a["cell-01"] != domain.PoolSharedDefault || a["cell-02"] != domain.PoolQuarantineDefault {
		t.Fatalf("initial assignments %v", a)
	}
	a["cell-03"] = "reserved-eu"
	if err := SaveAssignments(l.StateDir, topo, a); err != nil {
		t.Fatal(err)
	}
	got, err := LoadOrCreateAssignments(l.StateDir, topo)
	if err != nil || got["cell-03"] != "reserved-eu" {
		t.Fatalf("reload: %v %v", got, err)
	}
	again, _, _ := LoadOrCreate(l)
	if again.Slots[2] != topo.Slots[2] {
		t.Error("assignment changed the slot's identity, ports or paths")
	}
	for _, bad := range []Assignments{{"cell-09": "shared-x"}, {"cell-01": "premium"}} {
		if err := SaveAssignments(l.StateDir, topo, bad); err == nil {
			t.Errorf("assignments %v accepted", bad)
		}
	}
}

// A start rewrites (and fsyncs) a slot's keepalive include only when it
// disagrees with the drained marker.
func TestMakeDirsRewritesOnlyAStaleDrainInclude(t *testing.T) {
	l := layout(t, 2, freeBase(t, 4), 0)
	l.HTTPSBase = l.HTTPBase + 2
	topo, _, err := LoadOrCreate(l)
	if err != nil {
		t.Fatal(err)
	}
	serving, drained := topo.Slots[0], topo.Slots[1]
	if err := os.WriteFile(drained.DrainedMarker(), []byte("drained\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(serving.DrainConf())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreate(l); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(serving.DrainConf())
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Error("the serving slot's include, already right, was rewritten")
	}
	got, err := os.ReadFile(drained.DrainConf())
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "# written by cellvisor: drained\nkeepalive_timeout 0;\n" {
		t.Errorf("the drained slot's include is %q, want keepalive_timeout 0", got)
	}
}
