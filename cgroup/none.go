package cgroup

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"cellvisor/internal/procstat"
)

// none is the unenforced mode: no limits, and a cell's process tree is found
// and killed through its process group instead of a cgroup.
type none struct {
	signaller
	reason error
	mu     sync.Mutex // guards groups
	groups map[string]*noneGroup
}

func newNone(reason error) *none { return &none{reason: reason, groups: map[string]*noneGroup{}} }

func (n *none) Mode() Mode                                  { return ModeUnenforced }
func (n *none) Reason() error                               { return n.reason }
func (n *none) Path() string                                { return "" }
func (n *none) PrepareSelf(Limits) error                    { return nil }
func (n *none) MoveSelf() error                             { return nil }
func (n *none) LimitSelf(Limits) error                      { return nil }
func (n *none) WeighSelf(int) error                         { return nil }
func (n *none) Ensure(name string, _ Limits) (Group, error) { return n.Open(name) }

// Open returns the slot's group, the same one each time, so that it keeps
// the process group of the cell it started.
func (n *none) Open(name string) (Group, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	g := n.groups[name]
	if g == nil {
		g = &noneGroup{m: n, name: name}
		n.groups[name] = g
	}
	return g, nil
}

func (n *none) List() ([]string, error) { return nil, nil }
func (n *none) Remove() error           { return nil }

// Lock has no subtree to take: an unenforced agent's cells are its own
// process groups, and the state directory's lock keeps agents apart.
func (n *none) Lock() (io.Closer, error) { return nopCloser{}, nil }

type noneGroup struct {
	m    *none
	name string
	mu   sync.Mutex // guards pgid
	pgid int
}

func (g *noneGroup) Name() string { return g.name }
func (g *noneGroup) Path() string { return "" }

// Paths is nil: an unenforced cell is in no group of its own.
func (g *noneGroup) Paths() map[string]string { return nil }

// Prepare puts the cell in a new process group, remembered once started.
func (g *noneGroup) Prepare(cmd *exec.Cmd) (func(bool), error) {
	wrapCred(cmd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	return func(started bool) {
		if started {
			g.mu.Lock()
			g.pgid = cmd.Process.Pid
			g.mu.Unlock()
		}
	}, nil
}

func (g *noneGroup) group() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pgid
}

// Procs scans /proc for members of the cell's process group: as this
// process and, with a SignalFunc, as the group's user too (a /proc that
// hides other users' processes shows each its own).
func (g *noneGroup) Procs() ([]int, error) {
	pgid := g.group()
	if pgid == 0 {
		return nil, nil
	}
	pids, err := processGroupMembers(pgid)
	if err != nil {
		return nil, err
	}
	if f := g.m.f.Load(); f != nil && *f != nil {
		var theirs []int
		if err := (*f)(g.name, func() (err error) { theirs, err = processGroupMembers(pgid); return err }); err != nil {
			return nil, err
		}
		for _, p := range theirs {
			if !slices.Contains(pids, p) {
				pids = append(pids, p)
			}
		}
	}
	return pids, nil
}

func (g *noneGroup) Kill(ctx context.Context) error {
	pgid := g.group()
	if pgid == 0 {
		return nil
	}
	var killed []int
	err := waitEmpty(ctx, func() ([]int, error) {
		_ = g.m.signal(g.name, -pgid, syscall.SIGKILL)
		pids, err := g.Procs()
		killed = append(killed, pids...)
		return pids, err
	})
	reapOrphans(killed)
	if err != nil {
		return fmt.Errorf("kill %s: %w", g.name, err)
	}
	return nil
}

func (g *noneGroup) Delete(ctx context.Context) error { return g.Kill(ctx) }
func (g *noneGroup) Usage() (Usage, error)            { return Usage{}, nil }
func (g *noneGroup) Limits() (Limits, error)          { return Limits{}, nil }

// processGroupMembers lists live (non-zombie) processes whose process group is pgid.
func processGroupMembers(pgid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procstat.Fields(pid)
		if err != nil || f[0] == "Z" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			out = append(out, pid)
		}
	}
	return out, nil
}
