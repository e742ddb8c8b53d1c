package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"cellvisor/cgroup"
	"cellvisor/internal/procstat"
)

// A demo killed with SIGKILL (and its agent with it) leaves its cells
// running: nginx masters in their own process groups, holding the demo's
// ports. The next demo, holding the directory's lock, stops them before it
// removes their state. A process is only signalled once it is proven to be
// the one the demo started: the recorded start time for the agent, and for a
// cell, the nginx binary as its executable, a command line inside the demo
// directory and, where cgroups are used, membership of the demo's subtree.
// Nothing is ever killed by name.

// agentPidFile records the running agent as "PID STARTTIME".
const agentPidFile = "agent.pid"

// leftoverWait bounds the wait for one leftover process to go after it was
// signalled.
const leftoverWait = 30 * time.Second

// procInfo is what /proc says of a live process.
type procInfo struct {
	exe     string // the executable, " (deleted)" trimmed
	cmdline string // arguments joined by spaces
	cgroup  string // /proc/PID/cgroup
	start   uint64 // start time in clock ticks since boot
	pgid    int
}

// readProc reads pid's /proc entries; ok is false when it is gone (or a
// zombie, which is as good as gone: it holds no port).
func readProc(pid int) (procInfo, bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	f, err := procstat.Fields(pid)
	if err != nil || procstat.Dead(f[0]) {
		return procInfo{}, false
	}
	var p procInfo
	p.pgid, _ = strconv.Atoi(f[2])
	p.start, _ = strconv.ParseUint(f[19], 10, 64)
	exe, _ := os.Readlink(filepath.Join(dir, "exe"))
	p.exe = strings.TrimSuffix(exe, " (deleted)")
	cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
	p.cmdline = strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
	cg, _ := os.ReadFile(filepath.Join(dir, "cgroup"))
	p.cgroup = string(cg)
	return p, true
}

// sameFile reports whether two paths name the same executable.
func sameFile(a, b string) bool {
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	if err1 != nil || err2 != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return ra == rb
}

// writeAgentPid records the agent's pid and start time.
func writeAgentPid(root string, pid int) error {
	p, ok := readProc(pid)
	if !ok {
		return fmt.Errorf("agent pid %d: not running", pid)
	}
	return os.WriteFile(filepath.Join(root, agentPidFile), fmt.Appendf(nil, "%d %d\n", pid, p.start), 0o644)
}

// leftovers stops what an earlier demo in root left running.
type leftovers struct {
	root     string // the demo directory, absolute
	agentBin string // the agent binary
	nginx    string // the cells' binary
	subtree  string // the demo's cgroup subtree
	out      io.Writer
}

// stop stops the earlier agent, then the cells, then removes the cell
// cgroups left in the subtree. It reports what it stopped.
func (l leftovers) stop(ctx context.Context) error {
	var errs []error
	if err := l.stopAgent(ctx); err != nil {
		errs = append(errs, err)
	}
	cells, _ := filepath.Glob(filepath.Join(l.root, "run", "cell-*", "nginx.pid"))
	for _, pidFile := range cells {
		if err := l.stopCell(ctx, pidFile); err != nil {
			errs = append(errs, err)
		}
	}
	if err := l.removeGroups(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func readPidFile(path string) []uint64 {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 64 {
		return nil
	}
	var v []uint64
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}

// stopAgent stops an agent of an earlier demo that is still running (its
// pid file names it and its start time matches): SIGTERM, so that it stops
// its cells, and SIGKILL past the bound.
func (l leftovers) stopAgent(ctx context.Context) error {
	v := readPidFile(filepath.Join(l.root, agentPidFile))
	if len(v) != 2 || v[0] == 0 {
		return nil
	}
	pid := int(v[0])
	p, ok := readProc(pid)
	if !ok || p.start != v[1] || !sameFile(p.exe, l.agentBin) && !strings.Contains(p.cmdline, filepath.Join(l.root, "agent.yaml")) {
		return nil // gone, or the pid now belongs to another process
	}
	fmt.Fprintf(l.out, "an agent of an earlier demo is still running (pid %d): stopping it\n", pid)
	_ = syscall.Kill(pid, syscall.SIGTERM)
	if waitGone(ctx, pid, p.start, leftoverWait) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if !waitGone(ctx, pid, p.start, 5*time.Second) {
		return fmt.Errorf("the earlier demo's agent (pid %d) did not exit after SIGKILL", pid)
	}
	return nil
}

// stopCell stops the cell whose pid file is pidFile, when it is one of this
// demo's cells.
func (l leftovers) stopCell(ctx context.Context, pidFile string) error {
	v := readPidFile(pidFile)
	if len(v) != 1 || v[0] <= 1 {
		return nil
	}
	pid := int(v[0])
	p, ok := readProc(pid)
	if !ok {
		return nil
	}
	cell := filepath.Base(filepath.Dir(pidFile))
	if !l.isOurCell(p, cell) {
		return nil
	}
	fmt.Fprintf(l.out, "%s of an earlier demo is still running (nginx master pid %d): stopping it\n", cell, pid)
	// The master leads its process group (the agent starts cells with
	// Setpgid), and its workers are in it.
	target := pid
	if p.pgid == pid {
		target = -pid
	}
	_ = syscall.Kill(target, syscall.SIGKILL)
	if !waitGone(ctx, pid, p.start, leftoverWait) {
		return fmt.Errorf("%s of an earlier demo (pid %d) did not exit after SIGKILL", cell, pid)
	}
	return nil
}

// isOurCell checks p is the nginx master of cell in this demo directory.
func (l leftovers) isOurCell(p procInfo, cell string) bool {
	if !sameFile(p.exe, l.nginx) || !strings.Contains(p.cmdline, l.root+string(filepath.Separator)) {
		return false
	}
	// Where the cell ran in a cgroup (cell-NN), it must be the demo's group
	// of that cell.
	inCell, inOurs := false, false
	for _, line := range strings.Split(p.cgroup, "\n") {
		path := line[strings.LastIndexByte(line, ':')+1:]
		if filepath.Base(path) == cell {
			inCell = true
			inOurs = inOurs || filepath.Base(filepath.Dir(path)) == l.subtree
		}
	}
	return !inCell || inOurs
}

// removeGroups kills and removes the cell cgroups left in the demo's
// subtree below this process's cgroup (where an earlier demo from the same
// session made them).
func (l leftovers) removeGroups(ctx context.Context) error {
	m, err := cgroup.New(cgroup.Options{Subtree: l.subtree})
	if err != nil || m.Mode() == cgroup.ModeUnenforced {
		return nil
	}
	names, err := m.List()
	if err != nil {
		return nil
	}
	var errs []error
	for _, name := range names {
		g, err := m.Open(name)
		if err != nil {
			continue
		}
		fmt.Fprintf(l.out, "removing the cgroup %s of an earlier demo\n", g.Path())
		dctx, cancel := context.WithTimeout(ctx, leftoverWait)
		if err := g.Delete(dctx); err != nil {
			errs = append(errs, fmt.Errorf("remove the earlier demo's cgroup %s: %w", g.Path(), err))
		}
		cancel()
	}
	if len(errs) == 0 {
		_ = m.Remove() // the subtree too, which the look (cgroup.New) makes
	}
	return errors.Join(errs...)
}

// waitGone waits, bounded, until pid (started at start) is gone. It polls:
// the process is not this one's child, so there is nothing to wait on.
func waitGone(ctx context.Context, pid int, start uint64, bound time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if p, ok := readProc(pid); !ok || p.start != start {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}
