package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// v2 manages the subtree on a unified (cgroup v2) host.
type v2 struct {
	signaller
	root string
	base string // the cells' subtree relative to root, e.g. /system.slice/cellvisor.service
	// agentBase holds the agent's leaf: base, or the agent's own subtree
	// when the cells live in a scope of their own.
	agentBase string
	subtree   string
	// join starts cells through the join helper (cgexec) instead of
	// cloning them into their cgroup: where clone3 is refused (systemd's
	// RestrictNamespaces=) or missing.
	join bool
}

func newV2(root string, self selfPaths, subtree, cells string) (*v2, error) {
	own, ok := self[""]
	if !ok {
		return nil, fmt.Errorf("cgroup v2: this process has no unified cgroup")
	}
	m := &v2{root: root, base: path.Join(own, subtree), agentBase: path.Join(own, subtree), subtree: subtree, join: !clone3Probe()}
	parents := []string{own}
	if cells != "" {
		m.base = path.Join(cells, subtree)
		parents = append(parents, cells)
		if err := checkCommonAncestor(root, own, cells); err != nil {
			return nil, err
		}
	}
	for _, p := range parents {
		if err := checkControllers(root, p); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(m.dir(""), 0o755); err != nil {
		return nil, fmt.Errorf("cgroup v2: create subtree: %w", err)
	}
	if err := checkWritable(m.dir("")); err != nil {
		return nil, fmt.Errorf("cgroup v2: subtree %s not delegated to this user: %w", m.dir(""), err)
	}
	if subtree != "" || cells != "" {
		// A fresh subtree (or a scope whose holder sits in a leaf of its own) holds no process, so its cells can get controllers
		// now if they can at all; find out before any cell needs them.
		if err := writeFile(join(m.dir(""), "cgroup.subtree_control"), "+memory +cpu +pids"); err != nil {
			return nil, fmt.Errorf("cgroup v2: cannot enable memory, cpu and pids for cells under %s: %w (the agent's own cgroup must delegate them: run under systemd with Delegate=yes)", m.base, err)
		}
	}
	return m, nil
}

// checkCommonAncestor checks cgroup v2's rule for creating (or moving) a
// process in another cgroup: the writer must be allowed to write the
// cgroup.procs of the common ancestor of the source and the destination
// (the kernel's cgroup_procs_write_permission). The agent, in own, starts
// cells in cells: a non-root agent whose unit and cells' scope meet only in
// a slice it was not handed (system.slice) would have every start refused
// with EACCES. Root passes the kernel's check, and so this one.
func checkCommonAncestor(root, own, cells string) error {
	return ancestorRule(root, own, cells, myIDs())
}

// ids are a process's effective user, group and supplementary groups.
type ids struct {
	uid, gid int
	groups   []int
}

func myIDs() ids {
	groups, _ := os.Getgroups()
	return ids{uid: os.Geteuid(), gid: os.Getegid(), groups: groups}
}

// ancestorRule is checkCommonAncestor for a process of id.
func ancestorRule(root, own, cells string, id ids) error {
	if id.uid == 0 {
		return nil
	}
	anc := commonAncestor(own, cells)
	ok, err := writableBy(join(root, anc, "cgroup.procs"), id)
	if err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	if !ok {
		return fmt.Errorf("cgroup v2: the agent (in %s) may not start processes in the cells' cgroup %s: their common ancestor %s's cgroup.procs is not writable by uid %d (cgroup v2's common-ancestor rule); run the agent's unit and the cells' scope in a slice of their own whose cgroup.procs cellvisor prepare-cgroups hands to the agent (the packaged unit: Slice=cellvisor.slice; docs/cgroups.md)", own, cells, anc, id.uid)
	}
	return nil
}

// commonAncestor is the deepest cgroup that holds both a and b (clean
// absolute paths).
func commonAncestor(a, b string) string {
	for a != "/" && b != a && !strings.HasPrefix(b, a+"/") {
		a = path.Dir(a)
	}
	return a
}

// writableBy tells whether a process of id may write f, from its owner and
// mode: faccessat would answer EROFS where a read-only bind mount
// (systemd's ProtectSystem=) covers it, though the kernel's check for a
// migration reads the inode's permissions, not the mount's.
func writableBy(f string, id ids) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(f, &st); err != nil {
		return false, err
	}
	switch {
	case int(st.Uid) == id.uid:
		return st.Mode&0o200 != 0, nil
	case int(st.Gid) == id.gid || slices.Contains(id.groups, int(st.Gid)):
		return st.Mode&0o020 != 0, nil
	}
	return st.Mode&0o002 != 0, nil
}

// checkControllers tells whether memory, cpu and pids are delegated to p.
func checkControllers(root, p string) error {
	have, err := readFile(join(root, p, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	avail := strings.Fields(string(have))
	for _, c := range []string{"memory", "cpu", "pids"} {
		if !slices.Contains(avail, c) {
			return fmt.Errorf("cgroup v2: controller %s is not delegated to %s (available: %q); run under systemd with Delegate=yes", c, p, avail)
		}
	}
	return nil
}

func (m *v2) Mode() Mode               { return ModeV2 }
func (m *v2) Reason() error            { return nil }
func (m *v2) Path() string             { return m.base }
func (m *v2) Lock() (io.Closer, error) { return lockDir(m.dir("")) }
func (m *v2) dir(name string) string   { return join(m.root, m.base, name) }
func (m *v2) List() ([]string, error)  { return listCells(m.dir("")) }

func (m *v2) Ensure(name string, l Limits) (Group, error) {
	if err := m.ensureAt(m.base, name, l); err != nil {
		return nil, err
	}
	return &v2Group{m: m, name: name}, nil // made just now: Open's stat would only find it
}

// ensureAt creates or updates group name under base with l.
func (m *v2) ensureAt(base, name string, l Limits) error {
	err := m.create(path.Join(base, name), l)
	if err == nil {
		err = writeBurst(join(m.root, base, name, "cpu.max.burst"), l.CPUBurstUS)
	}
	if err != nil {
		if errors.Is(err, syscall.EBUSY) {
			// "No internal processes": controllers cannot be handed to
			// children of a cgroup that holds processes itself.
			return fmt.Errorf("create v2 cgroup %s: %w: %s holds processes of its own; let the agent move into its leaf (cgroup.place_agent: true) or set cgroup.subtree", name, err, base)
		}
		return fmt.Errorf("create v2 cgroup %s: %w", name, err)
	}
	return nil
}

// create creates (or updates) the group at path group below the mount:
// it enables memory, cpu and pids in its ancestors (enableControllers)
// and writes l's files (v2Settings). Where either fails it removes the
// group again if it made it; an update leaves the group as it was found.
func (m *v2) create(group string, l Limits) error {
	if err := checkGroupPath(group); err != nil {
		return err
	}
	dir := join(m.root, group)
	existed, err := makeGroupDir(dir)
	if err == nil && existed {
		err = writeBurst(join(dir, "cpu.max.burst"), 0) // see makeGroupDir
	}
	if err != nil {
		return err
	}
	undo := func() {
		if !existed {
			_ = os.Remove(dir)
		}
	}
	if err := enableControllers(m.root, dir); err != nil {
		undo()
		return err
	}
	for _, s := range v2Settings(l) {
		if err := writeFile(join(dir, s.file), s.value); err != nil {
			undo()
			return err
		}
	}
	return nil
}

func (m *v2) Open(name string) (Group, error) {
	if _, err := os.Stat(m.dir(name)); err != nil {
		return nil, fmt.Errorf("open v2 cgroup %s: %w", name, err)
	}
	return &v2Group{m: m, name: name}, nil
}

// PrepareSelf moves the agent into its leaf first: v2 allows controllers to
// be enabled for children only in a cgroup without processes of its own.
func (m *v2) PrepareSelf(l Limits) error {
	leaf := join(m.root, m.agentBase, AgentLeaf)
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		return fmt.Errorf("create agent leaf: %w", err)
	}
	if err := writeFile(join(leaf, "cgroup.procs"), strconv.Itoa(os.Getpid())); err != nil {
		return fmt.Errorf("move agent into its leaf: %w", err)
	}
	return m.ensureAt(m.agentBase, AgentLeaf, l)
}

// MoveSelf does nothing: PrepareSelf has moved the agent.
func (m *v2) MoveSelf() error { return nil }

// LimitSelf sets l on the agent leaf.
func (m *v2) LimitSelf(l Limits) error { return m.ensureAt(m.agentBase, AgentLeaf, l) }

// WeighSelf writes cpu.weight; without the cpu controller in the leaf (a
// parent that does not delegate it) there is no weight to set.
func (m *v2) WeighSelf(weight int) error {
	f := join(m.root, m.agentBase, AgentLeaf, "cpu.weight")
	if _, err := os.Stat(f); os.IsNotExist(err) {
		return nil
	}
	return writeFile(f, strconv.Itoa(min(max(weight, 1), 10000)))
}

func (m *v2) Remove() error {
	_ = os.Remove(join(m.root, m.agentBase, AgentLeaf))
	if m.agentBase != m.base && m.subtree != "" {
		_ = os.Remove(join(m.root, m.agentBase))
	}
	removeProbes(m.dir(""))
	if err := os.Remove(m.dir("")); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

type v2Group struct {
	m    *v2
	name string
}

func (g *v2Group) Name() string { return g.name }
func (g *v2Group) Path() string { return path.Join(g.m.base, g.name) }
func (g *v2Group) Paths() map[string]string {
	return map[string]string{"unified": g.Path()}
}
func (g *v2Group) file(f string) string { return join(g.m.dir(g.name), f) }

// Prepare clones the cell straight into its cgroup (CLONE_INTO_CGROUP), so it
// never runs outside its limits, not even between fork and exec. Where
// clone3 is refused, the cell starts through the join helper, which moves
// itself into the cgroup (writing "0" to its cgroup.procs) before it execs
// the cell: until then the helper runs in the agent's own limited leaf, so
// the cell's first instruction still runs inside its limits.
func (g *v2Group) Prepare(cmd *exec.Cmd) (func(bool), error) {
	if g.m.join {
		wrapExec(cmd, []string{g.file("cgroup.procs")})
		return nil, nil
	}
	fd, err := unix.Open(g.m.dir(g.name), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", g.name, err)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = fd
	wrapCred(cmd)
	return func(bool) { _ = unix.Close(fd) }, nil
}

func (g *v2Group) Procs() ([]int, error) {
	pids, err := readProcs(g.file("cgroup.procs"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	return pids, err
}

// Kill writes cgroup.kill (the kernel kills the whole tree, forks included),
// falling back to freeze-signal-thaw on kernels before 5.14.
func (g *v2Group) Kill(ctx context.Context) error {
	before, err := g.Procs()
	if err != nil {
		return fmt.Errorf("kill %s: %w", g.name, err)
	}
	if err := checkGroupPath(g.Path()); err != nil {
		return fmt.Errorf("kill %s: %w", g.name, err)
	}
	dir := g.m.dir(g.name)
	if err := killTree(ctx, dir, func(pids []int) { g.m.killPIDs(g.name, pids) }); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("kill %s: %w", g.name, err)
	}
	err = waitEmpty(ctx, g.Procs)
	reapOrphans(before)
	if err == nil {
		err = pruneChildren(ctx, dir)
	}
	if err != nil {
		return fmt.Errorf("kill %s: %w", g.name, err)
	}
	return nil
}

// pruneChildren removes every cgroup below the cell's group dir, deepest
// first, once the kill has emptied the tree: the agent makes none, so
// whatever is there was made by someone else (an operator's mkdir, a cell
// that was handed its cgroup) and would keep the group from being removed
// on a stop, and hide processes from the cell's own cgroup.procs. Their
// processes were killed with the group (cgroup.kill takes the subtree).
func pruneChildren(ctx context.Context, dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		child := join(dir, e.Name())
		procs := func() ([]int, error) {
			pids, err := treeProcs(child)
			if os.IsNotExist(err) {
				return nil, nil
			}
			return pids, err
		}
		if err := waitEmpty(ctx, procs); err != nil {
			return fmt.Errorf("cgroup %s below the cell: %w", child, err)
		}
		if err := pruneChildren(ctx, child); err != nil {
			return err
		}
		if err := removeDir(ctx, child); err != nil {
			return fmt.Errorf("remove cgroup %s below the cell: %w", child, err)
		}
	}
	return nil
}

func (g *v2Group) Delete(ctx context.Context) error {
	if err := g.Kill(ctx); err != nil {
		return err
	}
	return removeDir(ctx, g.m.dir(g.name))
}

func (g *v2Group) Usage() (Usage, error) {
	var u Usage
	var err error
	read := func(f string, dst *uint64) {
		if err == nil {
			*dst, err = readUint(g.file(f))
		}
	}
	read("memory.current", &u.MemoryBytes)
	read("memory.max", &u.MemoryLimit)
	read("pids.current", &u.PIDs)
	read("pids.max", &u.PIDsLimit)
	if err != nil {
		return Usage{}, fmt.Errorf("usage %s: %w", g.name, err)
	}
	if kv, err := readKV(g.file("memory.events")); err == nil {
		u.OOMKills = kv["oom_kill"]
	}
	if kv, err := readKV(g.file("pids.events")); err == nil {
		u.PIDsRefused = kv["max"]
	}
	if kv, err := readKV(g.file("cpu.stat")); err == nil {
		u.CPUUsageNS = kv["usage_usec"] * 1000
		u.CPUThrottled, u.CPUThrottleNS = kv["nr_throttled"], kv["throttled_usec"]*1000
	}
	return u, nil
}

func (g *v2Group) Limits() (Limits, error) {
	var l Limits
	mem, err := readUint(g.file("memory.max"))
	if err != nil {
		return l, err
	}
	pids, err := readUint(g.file("pids.max"))
	if err != nil {
		return l, err
	}
	b, err := readFile(g.file("cpu.max"))
	if err != nil {
		return l, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return l, fmt.Errorf("parse cpu.max %q", b)
	}
	quota := int64(-1)
	if f[0] != "max" {
		if quota, err = strconv.ParseInt(f[0], 10, 64); err != nil {
			return l, err
		}
	}
	period, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return l, err
	}
	burst, _ := readUint(g.file("cpu.max.burst")) // 0 where the kernel lacks it
	return Limits{MemoryBytes: int64(mem), CPUQuotaUS: quota, CPUPeriodUS: period, PIDs: int64(pids), CPUBurstUS: burst}, nil
}
