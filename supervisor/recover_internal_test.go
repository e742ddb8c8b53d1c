package supervisor

import (
	"context"
	"errors"
	"slices"
	"testing"

	"cellvisor/cgroup"
	"cellvisor/runtime"
)

// stubGroup is a cell group whose members and kill outcome a test sets;
// only the methods recovery and a start's leftover check call are here.
type stubGroup struct {
	cgroup.Group
	pids     []int
	procsErr error
	killErr  error
	killed   bool
}

func (g *stubGroup) Name() string                   { return "cell-01" }
func (g *stubGroup) Path() string                   { return "/stub/cell-01" }
func (g *stubGroup) Procs() ([]int, error)          { return g.pids, g.procsErr }
func (g *stubGroup) Kill(ctx context.Context) error { g.killed = true; return g.killErr }

// Recovery trusts a group as vacant (the agent's first start then skips
// its leftover check) only when it read the group empty or emptied it: a
// group it could not read, or whose leftovers it failed to kill, is read
// again by the start, which kills what is still there before it starts
// anything beside it.
func TestRecoverTrustsOnlyAGroupItEmptied(t *testing.T) {
	m, err := cgroup.New(cgroup.Options{Root: t.TempDir()}) // unenforced: never used here
	if err != nil {
		t.Fatal(err)
	}
	topo := runtime.Plan(runtime.Layout{Slots: 1, HTTPBase: 1000, HTTPSBase: 2000, StateDir: t.TempDir(), RunDir: t.TempDir()})
	// Under a refusal every leftover is stopped, whatever it is.
	s, err := New(Options{Binary: "/bin/true", Topology: topo, Cgroups: m, Refusal: errors.New("limits cannot be enforced")})
	if err != nil {
		t.Fatal(err)
	}
	c := s.slots[0]
	for _, tc := range []struct {
		name       string
		g          stubGroup
		wantKill   bool
		wantVacant bool
	}{
		{"empty", stubGroup{}, false, true},
		{"unreadable", stubGroup{procsErr: errors.New("read cgroup.procs: input/output error")}, false, false},
		{"leftovers killed", stubGroup{pids: []int{4242}}, true, true},
		{"leftovers not killed", stubGroup{pids: []int{4242}, killErr: cgroup.ErrNotEmpty}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.g
			c.vacant = false
			c.recover(context.Background(), &g)
			if g.killed != tc.wantKill {
				t.Errorf("killed %v, want %v", g.killed, tc.wantKill)
			}
			if c.vacant != tc.wantVacant {
				t.Errorf("vacant %v, want %v", c.vacant, tc.wantVacant)
			}
			left := c.leftovers(&g, c.vacant)
			if want := !tc.wantVacant && len(g.pids) > 0; want != slices.Contains(left, 4242) {
				t.Errorf("the start's leftover check found %v", left)
			}
		})
	}
}
