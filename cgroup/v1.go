package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// v1Controllers are the v1 hierarchies the agent needs, in the order
// ensureAt creates a group in them and writes its limits (v1Settings).
// name=systemd belongs to systemd and is never written.
var v1Controllers = []string{"memory", "cpu", "pids"}

// v1 manages the subtree on the v1 memory, cpu and pids hierarchies of a
// hybrid (or legacy) host, and on cpuacct's where it is a hierarchy of its
// own, for CPU usage. The subtree has the same relative path under each.
type v1 struct {
	signaller
	root string
	base map[string]string // controller -> the cells' subtree path relative to its mount
	// agentBase holds the agent's leaf (controller -> path): base, or the
	// agent's own subtree when the cells live in a scope of their own.
	agentBase map[string]string
	subtree   string
	// ctrls are the hierarchies cells join: v1Controllers, and cpuacct
	// where it is mounted apart from cpu.
	ctrls []string
	// acct is the hierarchy holding cpuacct.usage: "cpu" where cpuacct is
	// mounted with it, "cpuacct" where apart, "" where there is none (CPU
	// usage then reads 0).
	acct string
	// leafLimits are the agent leaf's limits until MoveSelf makes it
	// (PrepareSelf); nil once made.
	leafLimits *Limits
}

// v1Ctrls are the v1 hierarchies the agent uses on this host (cpuacct's
// too where it is mounted apart), and the one holding cpuacct.usage.
func v1Ctrls(root string, self selfPaths) (ctrls []string, acct string) {
	ctrls = slices.Clone(v1Controllers)
	acct = acctHierarchy(root, self)
	if acct == "cpuacct" {
		ctrls = append(ctrls, "cpuacct")
	}
	return ctrls, acct
}

func newV1(root string, self selfPaths, subtree, cells string) (*v1, error) {
	m := &v1{root: root, base: map[string]string{}, agentBase: map[string]string{}, subtree: subtree}
	m.ctrls, m.acct = v1Ctrls(root, self)
	for _, c := range m.ctrls {
		p, ok := self[c]
		if !ok {
			return nil, fmt.Errorf("cgroup v1: this process is in no %s cgroup", c)
		}
		m.agentBase[c] = path.Join(p, subtree)
		m.base[c] = m.agentBase[c]
		if cells != "" {
			// systemd realises a delegated scope at the same path in every
			// v1 hierarchy it manages.
			m.base[c] = path.Join(cells, subtree)
		}
		for _, b := range slices.Compact([]string{m.agentBase[c], m.base[c]}) {
			dir := join(root, c, b)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("cgroup v1: create subtree: %w", err)
			}
			if err := checkWritable(dir); err != nil {
				return nil, fmt.Errorf("cgroup v1: subtree %s not delegated to this user: %w", dir, err)
			}
		}
	}
	return m, nil
}

// acctHierarchy finds where CPU usage is accounted: in the cpu hierarchy
// when cpuacct is mounted with it (cpu,cpuacct, the usual layout), in its
// own hierarchy otherwise, or nowhere.
func acctHierarchy(root string, self selfPaths) string {
	if _, ok := self["cpuacct"]; !ok {
		return ""
	}
	acct, err := os.Stat(join(root, "cpuacct"))
	if err != nil || !acct.IsDir() {
		return ""
	}
	if cpu, err := os.Stat(join(root, "cpu")); err == nil && os.SameFile(cpu, acct) {
		return "cpu"
	}
	return "cpuacct"
}

// checkWritable tells whether this process may create groups in dir: the
// kernel's own permission check for a mkdir there (faccessat with the
// effective ids), which sees a subtree not delegated to this user, a
// read-only mount and a container's unprivileged root alike, without the
// mkdir and rmdir of a probe group, each of which waits on the kernel's
// global cgroup_mutex at every start. (Agents before this one probed so;
// removeProbes clears the probe such an agent killed mid-check left.)
func checkWritable(dir string) error {
	if err := unix.Faccessat(unix.AT_FDCWD, dir, unix.W_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
		return &os.PathError{Op: "access", Path: dir, Err: err}
	}
	return nil
}

// removeProbes removes the probe groups of older agents killed in the
// middle of their writability check: a stray probe would keep dir from
// ever being removed.
func removeProbes(dir string) {
	if stale, err := filepath.Glob(filepath.Join(dir, ".probe-*")); err == nil {
		for _, p := range stale {
			_ = os.Remove(p) // an empty cgroup: nothing of anyone's in it
		}
	}
}

func (m *v1) Mode() Mode    { return ModeV1Hybrid }
func (m *v1) Reason() error { return nil }
func (m *v1) Path() string  { return m.base["memory"] }

// Lock locks the subtree in the memory hierarchy: every agent of the same
// subtree meets there.
func (m *v1) Lock() (io.Closer, error) { return lockDir(m.dir("memory", "")) }

func (m *v1) dir(c, name string) string { return join(m.root, c, m.base[c], name) }

func (m *v1) Ensure(name string, l Limits) (Group, error) {
	if err := m.ensureAt(m.base, name, l); err != nil {
		return nil, err
	}
	return &v1Group{m: m, name: name}, nil // made just now: Open's stat would only find it
}

// ensureAt creates or updates group name under base (by controller) with l.
func (m *v1) ensureAt(base map[string]string, name string, l Limits) error {
	settings := v1Settings(l)
	for _, c := range v1Controllers {
		dir := join(m.root, c, base[c], name)
		existed, err := makeGroupDir(dir)
		if err == nil && existed && c == "cpu" {
			err = writeBurst(join(dir, "cpu.cfs_burst_us"), 0) // see makeGroupDir
		}
		if err != nil {
			return fmt.Errorf("create v1 cgroup %s: %w", name, err)
		}
		for _, s := range settings {
			if s.ctrl != c {
				continue
			}
			if err := writeFile(join(dir, s.file), s.value); err != nil {
				return fmt.Errorf("create v1 cgroup %s: %w", name, err)
			}
		}
	}
	if err := writeBurst(join(m.root, "cpu", base["cpu"], name, "cpu.cfs_burst_us"), l.CPUBurstUS); err != nil {
		return fmt.Errorf("create v1 cgroup %s: %w", name, err)
	}
	if m.acct == "cpuacct" { // accounting only: no limits there
		if _, err := makeGroupDir(join(m.root, "cpuacct", base["cpuacct"], name)); err != nil {
			return fmt.Errorf("create v1 cgroup %s: %w", name, err)
		}
	}
	return nil
}

func (m *v1) Open(name string) (Group, error) {
	if _, err := os.Stat(m.dir("memory", name)); err != nil {
		return nil, fmt.Errorf("open v1 cgroup %s: %w", name, err)
	}
	return &v1Group{m: m, name: name}, nil
}

func (m *v1) List() ([]string, error) { return listCells(join(m.root, "memory", m.base["memory"])) }

// PrepareSelf records l for the agent leaf, which MoveSelf makes: on v1 the
// agent stays where it is while its cells start, and a leaf made now would
// only put three more group creations (each under the kernel's global
// cgroup_mutex, the memory cgroup's the costliest) ahead of the cells'
// own, on the start's critical path.
func (m *v1) PrepareSelf(l Limits) error {
	m.leafLimits = &l
	return nil
}

// MoveSelf writes the agent's pid into the leaf's cgroup.procs in every
// hierarchy it is not in yet. A thread can move itself without the global
// threadgroup lock (the join helper does), but a Go process has several
// threads, so the agent moves as a whole process, once, when nothing waits
// on the lock it holds meanwhile.
func (m *v1) MoveSelf() error {
	if l := m.leafLimits; l != nil {
		if err := m.ensureAt(m.agentBase, AgentLeaf, *l); err != nil {
			return fmt.Errorf("create the agent leaf: %w", err)
		}
		m.leafLimits = nil
	}
	own, err := readOwn()
	if err != nil {
		return fmt.Errorf("move agent into its leaf: %w", err)
	}
	pid := strconv.Itoa(os.Getpid())
	for _, c := range m.ctrls {
		leaf := path.Join(m.agentBase[c], AgentLeaf)
		if own[c] == leaf {
			continue
		}
		if err := writeFile(join(m.root, c, leaf, "cgroup.procs"), pid); err != nil {
			return fmt.Errorf("move agent into its %s leaf: %w", c, err)
		}
	}
	return nil
}

// LimitSelf sets l on the agent leaf.
func (m *v1) LimitSelf(l Limits) error { return m.ensureAt(m.agentBase, AgentLeaf, l) }

// WeighSelf writes the weight as cpu.shares, of which 1024 is the default.
func (m *v1) WeighSelf(weight int) error {
	shares := min(max(weight*1024/DefaultWeight, 2), 262144)
	return writeFile(join(m.root, "cpu", m.agentBase["cpu"], AgentLeaf, "cpu.shares"), strconv.Itoa(shares))
}

// Remove removes the subtree. If the caller sits in the agent leaf it first
// moves back to the subtree's parent (v1 has no rule against that).
func (m *v1) Remove() error {
	var errs []error
	pid := strconv.Itoa(os.Getpid())
	for _, c := range m.ctrls {
		dir := join(m.root, c, m.agentBase[c])
		if procs, _ := readProcs(join(dir, AgentLeaf, "cgroup.procs")); slices.Contains(procs, os.Getpid()) {
			_ = writeFile(join(path.Dir(dir), "cgroup.procs"), pid)
		}
		_ = os.Remove(join(dir, AgentLeaf))
		dirs := []string{dir}
		if m.base[c] != m.agentBase[c] {
			dirs = append(dirs, join(m.root, c, m.base[c]))
			if m.subtree == "" {
				dirs = nil // the unit's cgroup and the scope's: systemd's, not ours
			}
		}
		for _, d := range dirs {
			removeProbes(d)
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

type v1Group struct {
	m    *v1
	name string
}

func (g *v1Group) Name() string { return g.name }
func (g *v1Group) Path() string { return path.Join(g.m.base["memory"], g.name) }

// Paths names the group in every hierarchy it spans: on a hybrid host the
// cpu, pids and cpuacct hierarchies may sit at other paths than memory's.
func (g *v1Group) Paths() map[string]string {
	out := make(map[string]string, len(g.m.ctrls))
	for _, c := range g.m.ctrls {
		out[c] = path.Join(g.m.base[c], g.name)
	}
	return out
}
func (g *v1Group) dir(c string) string     { return g.m.dir(c, g.name) }
func (g *v1Group) file(c, f string) string { return join(g.dir(c), f) }

// Prepare makes cmd start as the join helper, which moves itself into this
// group's memory, cpu and pids cgroups and only then execs the cell: the cell
// never runs outside its limits. (v1 has no clone-into-cgroup.)
func (g *v1Group) Prepare(cmd *exec.Cmd) (func(bool), error) {
	wrapExec(cmd, g.joinFiles())
	return nil, nil
}

// joinFiles are the files the join helper moves itself in by: each
// hierarchy's tasks file, where a thread moving itself takes no
// threadgroup lock (see cgexec).
func (g *v1Group) joinFiles() []string {
	files := make([]string, 0, len(g.m.ctrls))
	for _, c := range g.m.ctrls {
		files = append(files, g.file(c, "tasks"))
	}
	return files
}

// PrepareStandby makes cmd start as a standby joining this group's
// hierarchies (see StandbyGroup).
func (g *v1Group) PrepareStandby(cmd *exec.Cmd) (*Standby, func(bool), error) {
	return wrapStandby(cmd, g.joinFiles())
}

// Procs lists every process in any of the group's controllers (the exec
// helper joins them one after another).
func (g *v1Group) Procs() ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, c := range g.m.ctrls {
		pids, err := readProcs(g.file(c, "cgroup.procs"))
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		for _, p := range pids {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// Kill first sets pids.max to 0 so nothing in the group can fork, then
// SIGKILLs every member until the group is empty: with no forks possible the
// loop converges even against a fork bomb. The pids limit is restored after.
func (g *v1Group) Kill(ctx context.Context) error { return g.KillExcept(ctx, 0) }

// KillExcept is Kill sparing keep (0: none), a standby of the group, which
// forks nothing and so cannot keep the group from emptying of the rest.
func (g *v1Group) KillExcept(ctx context.Context, keep int) error { return g.kill(ctx, keep, true) }

// Condemn is KillExcept without the wait for the killed to be gone (see
// the package's Condemn).
func (g *v1Group) Condemn(ctx context.Context, keep int) error { return g.kill(ctx, keep, false) }

// kill freezes forks (pids.max 0) and SIGKILLs every member but keep: with
// wait, until the group is empty; without, until a reading of the group
// finds no member it has not killed yet (then every member has a SIGKILL
// pending, and none can fork any more). The pids limit is restored after.
func (g *v1Group) kill(ctx context.Context, keep int, wait bool) error {
	pidsMax := g.file("pids", "pids.max")
	prev, err := readFile(pidsMax)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("kill %s: %w", g.name, err)
	}
	if err := writeFile(pidsMax, "0"); err != nil {
		return fmt.Errorf("kill %s: freeze forks: %w", g.name, err)
	}
	var killed []int
	err = waitEmpty(ctx, func() ([]int, error) {
		pids, err := g.Procs()
		pids = slices.DeleteFunc(pids, func(p int) bool { return p == keep })
		if !wait {
			pids = slices.DeleteFunc(pids, func(p int) bool { return slices.Contains(killed, p) })
		}
		g.m.killPIDs(g.name, pids)
		killed = append(killed, pids...)
		return pids, err
	})
	if wait {
		reapOrphans(killed)
	} else if len(killed) > 0 {
		go reapWhenGone(killed)
	}
	if rerr := writeFile(pidsMax, strings.TrimSpace(string(prev))); rerr != nil && err == nil {
		err = fmt.Errorf("restore pids.max: %w", rerr)
	}
	if err != nil {
		return fmt.Errorf("kill %s: %w", g.name, err)
	}
	return nil
}

func (g *v1Group) Delete(ctx context.Context) error {
	if err := g.Kill(ctx); err != nil {
		return err
	}
	var errs []error
	for _, c := range g.m.ctrls {
		errs = append(errs, removeDir(ctx, g.dir(c)))
	}
	return errors.Join(errs...)
}

func (g *v1Group) Usage() (Usage, error) {
	var u Usage
	var err error
	read := func(f string, dst *uint64) {
		if err == nil {
			*dst, err = readUint(f)
		}
	}
	read(g.file("memory", "memory.usage_in_bytes"), &u.MemoryBytes)
	read(g.file("memory", "memory.limit_in_bytes"), &u.MemoryLimit)
	read(g.file("pids", "pids.current"), &u.PIDs)
	read(g.file("pids", "pids.max"), &u.PIDsLimit)
	if err != nil {
		return Usage{}, fmt.Errorf("usage %s: %w", g.name, err)
	}
	if kv, err := readKV(g.file("memory", "memory.oom_control")); err == nil {
		u.OOMKills = kv["oom_kill"]
	}
	if kv, err := readKV(g.file("pids", "pids.events")); err == nil {
		u.PIDsRefused = kv["max"]
	}
	if kv, err := readKV(g.file("cpu", "cpu.stat")); err == nil {
		u.CPUThrottled, u.CPUThrottleNS = kv["nr_throttled"], kv["throttled_time"]
	}
	if g.m.acct != "" {
		u.CPUUsageNS, _ = readUint(g.file(g.m.acct, "cpuacct.usage"))
	}
	return u, nil
}

func (g *v1Group) Limits() (Limits, error) {
	var l Limits
	mem, err := readUint(g.file("memory", "memory.limit_in_bytes"))
	if err != nil {
		return l, err
	}
	quota, err := readFile(g.file("cpu", "cpu.cfs_quota_us"))
	if err != nil {
		return l, err
	}
	period, err := readUint(g.file("cpu", "cpu.cfs_period_us"))
	if err != nil {
		return l, err
	}
	pids, err := readUint(g.file("pids", "pids.max"))
	if err != nil {
		return l, err
	}
	q, err := strconv.ParseInt(strings.TrimSpace(string(quota)), 10, 64)
	if err != nil {
		return l, err
	}
	burst, _ := readUint(g.file("cpu", "cpu.cfs_burst_us")) // 0 where the kernel lacks it
	return Limits{MemoryBytes: int64(mem), CPUQuotaUS: q, CPUPeriodUS: period, PIDs: int64(pids), CPUBurstUS: burst}, nil
}
