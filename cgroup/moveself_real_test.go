package cgroup_test

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"strings"
	"testing"

	"cellvisor/cgroup"
	"cellvisor/testkit/testutil"
)

// moveSelfEnv names the subtree TestMoveSelfHelper works in, when it runs as
// the child of TestPrepareSelfThenMoveSelf.
const moveSelfEnv = "CELLVISOR_TEST_MOVESELF_SUBTREE"

// A process of many threads (Go's, as the agent's) is in its leaf once
// MoveSelf has run: on v2 from PrepareSelf on (controllers need it there), on
// v1 only from MoveSelf, which the agent calls once its cells have started.
// A second MoveSelf changes nothing. The child reports its own membership.
func TestPrepareSelfThenMoveSelf(t *testing.T) {
	m := testutil.RequireCgroups(t)
	subtree := path.Base(m.Path())
	cmd := exec.Command(os.Args[0], "-test.run=^TestMoveSelfHelper$", "-test.v")
	cmd.Env = append(os.Environ(), moveSelfEnv+"="+subtree)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	leafIn := func(stage string) map[string]bool {
		in := map[string]bool{}
		for line := range strings.Lines(string(out)) {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), stage+" ")
			if !ok {
				continue
			}
			f := strings.SplitN(rest, ":", 3)
			if len(f) == 3 {
				for _, c := range strings.Split(f[1], ",") {
					in[c] = strings.HasSuffix(f[2], "/"+subtree+"/"+cgroup.AgentLeaf)
				}
			}
		}
		return in
	}
	ctrls := map[cgroup.Mode][]string{cgroup.ModeV2: {""}, cgroup.ModeV1Hybrid: {"memory", "cpu", "pids"}}[m.Mode()]
	prepared, moved, again := leafIn("prepared"), leafIn("moved"), leafIn("again")
	for _, c := range ctrls {
		if want := m.Mode() == cgroup.ModeV2; prepared[c] != want {
			t.Errorf("%s %q after PrepareSelf: in the leaf %v, want %v\n%s", m.Mode(), c, prepared[c], want, out)
		}
		if !moved[c] || !again[c] {
			t.Errorf("%q after MoveSelf: in the leaf %v, after a second %v; want both\n%s", c, moved[c], again[c], out)
		}
	}
}

// TestMoveSelfHelper is the child of TestPrepareSelfThenMoveSelf; it does
// nothing in a normal run.
func TestMoveSelfHelper(t *testing.T) {
	subtree := os.Getenv(moveSelfEnv)
	if subtree == "" {
		t.Skip("the child of TestPrepareSelfThenMoveSelf")
	}
	m, err := cgroup.New(cgroup.Options{Subtree: subtree})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Remove(); err != nil { // moves this process out again
			t.Error(err)
		}
	}()
	report := func(stage string) {
		b, err := os.ReadFile("/proc/self/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			fmt.Printf("%s %s", stage, line)
		}
	}
	if err := m.PrepareSelf(cgroup.Limits{MemoryBytes: 1 << 30, CPUQuotaUS: -1, CPUPeriodUS: 100000}); err != nil {
		t.Fatal(err)
	}
	report("prepared")
	if err := m.MoveSelf(); err != nil {
		t.Fatal(err)
	}
	report("moved")
	if err := m.MoveSelf(); err != nil {
		t.Fatal(err)
	}
	report("again")
}

// Agents before this one probed the subtree's writability with a probe
// group: one killed mid-check left it behind, and Remove takes it away
// rather than failing on a subtree that is not empty.
func TestRemoveClearsAnOlderAgentsStrayProbe(t *testing.T) {
	m := testutil.RequireCgroups(t)
	dir := path.Join("/sys/fs/cgroup", m.Path())
	if m.Mode() == cgroup.ModeV1Hybrid {
		dir = path.Join("/sys/fs/cgroup/memory", m.Path())
	}
	probe := path.Join(dir, ".probe-1234")
	if err := os.Mkdir(probe, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(); err != nil {
		t.Fatalf("remove with a stray probe: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("subtree %s still there (%v)", dir, err)
	}
}

// On v1 PrepareSelf makes nothing (the agent's leaf would only queue its
// group creations ahead of the cells' own during the start); MoveSelf
// makes the leaf, with PrepareSelf's limits, before moving in (the child
// of TestPrepareSelfThenMoveSelf moves in). On v2 the leaf is made at once.
func TestV1LeafIsMadeByMoveSelfNotPrepareSelf(t *testing.T) {
	m := testutil.RequireCgroups(t)
	if m.Mode() != cgroup.ModeV1Hybrid {
		t.Skipf("cgroup mode %s: the leaf is made by PrepareSelf there", m.Mode())
	}
	if err := m.PrepareSelf(cgroup.Limits{MemoryBytes: 1 << 30, CPUQuotaUS: -1, CPUPeriodUS: 100000}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Open(cgroup.AgentLeaf); err == nil {
		t.Error("PrepareSelf made the agent leaf on v1, before the cells' groups")
	}
}
