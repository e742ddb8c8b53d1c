package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoV1 says there is no v1 hierarchy to prepare: a cgroup v2 host, where
// systemd's Delegate=yes hands the unit's cgroup over by itself, or a host
// without the v1 controllers (the agent then says why it cannot enforce).
var ErrNoV1 = errors.New("no cgroup v1 controllers to prepare")

// PrepareOptions configures PrepareV1.
type PrepareOptions struct {
	// Root is the cgroup filesystem mount, or "" for /sys/fs/cgroup.
	Root string
	// ProcSelfCgroup is the content of /proc/self/cgroup, or nil to read it.
	ProcSelfCgroup []byte
	// UID and GID receive the cgroups: the agent's user and group.
	UID, GID int
}

// handedFiles are the files of a handed-over cgroup its new owner must
// write: moving processes in (the agent into its leaf, a restarted agent's
// cleanup). The limit files stay root's: the agent cannot lift its unit's
// own limits, only set those of the groups it creates below.
var handedFiles = []string{"cgroup.procs", "tasks"}

// PrepareV1 is the privileged step before a non-root agent starts on a
// hybrid (or legacy) host, where systemd's Delegate=yes hands only the
// unified (and name=systemd) hierarchy to the unit's user. It runs as root
// in the unit's cgroups (ExecStartPre=+) and hands the calling process's
// own v1 memory, cpu and pids cgroups (and cpuacct's, where it is a
// hierarchy of its own) to UID:GID: each directory and its cgroup.procs and
// tasks files, nothing else, never name=systemd. systemd runs a delegated
// unit's control processes in a ".control" child, so that child's parent,
// the unit's cgroup, is handed over. It returns the directories it handed
// over, and ErrNoV1 where there are none to hand over.
func PrepareV1(o PrepareOptions) ([]string, error) {
	if o.Root == "" {
		o.Root = "/sys/fs/cgroup"
	}
	if o.UID <= 0 || o.GID < 0 {
		return nil, fmt.Errorf("prepare cgroups: uid %d gid %d: want the agent's non-root user", o.UID, o.GID)
	}
	kind, err := detect(o.Root)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrNoV1, err)
	case kind != kindV1:
		return nil, fmt.Errorf("%w: %s is a cgroup v2 mount", ErrNoV1, o.Root)
	}
	self, err := readSelf(o.ProcSelfCgroup)
	if err != nil {
		return nil, err
	}
	ctrls, _ := v1Ctrls(o.Root, self)
	var dirs []string
	for _, c := range ctrls {
		p, err := unitCgroup(self, c)
		if err != nil {
			return dirs, err
		}
		dir := join(o.Root, c, p)
		if err := handOver(dir, o.UID, o.GID); err != nil {
			return dirs, fmt.Errorf("prepare cgroups: %s: %w", c, err)
		}
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

// unitCgroup is the unit's cgroup in controller c's hierarchy, from the
// process's own: its ".control" child's parent. The root of a hierarchy is
// refused: that is not a unit's cgroup but the whole host's.
func unitCgroup(self selfPaths, c string) (string, error) {
	p, ok := self[c]
	if !ok {
		return "", fmt.Errorf("prepare cgroups: this process is in no %s cgroup", c)
	}
	// parseSelf already read a trailing "agent" leaf as its parent.
	if path.Base(p) == ".control" {
		p = path.Dir(p)
	}
	if p == "/" {
		return "", fmt.Errorf("prepare cgroups: this process is in the root %s cgroup: run it from the unit (ExecStartPre=+), not by hand", c)
	}
	return p, nil
}

// handOver chowns dir and its handedFiles after checking dir is a cgroup v1
// directory (not a symlink, not another filesystem). Nothing is followed.
func handOver(dir string, uid, gid int) error {
	return chownTree(dir, unix.CGROUP_SUPER_MAGIC, handedFiles, uid, gid)
}

// scopeV2Files are the files of a delegated v2 cgroup its owner writes, as
// systemd hands them to a delegated unit's user.
var scopeV2Files = []string{"cgroup.procs", "cgroup.subtree_control", "cgroup.threads"}

// HandOverScope hands the cells' systemd scope, cgroup cg (its
// ControlGroup), to UID:GID: on a hybrid host its v1 memory, cpu and pids
// directories (and cpuacct's, where apart) with their cgroup.procs and
// tasks, as PrepareV1 does for the unit's; on a v2 host its unified
// directory with cgroup.procs, cgroup.subtree_control and cgroup.threads.
// Its limit files stay root's. It returns the directories handed over.
func HandOverScope(o PrepareOptions, cg string) ([]string, error) {
	if o.Root == "" {
		o.Root = "/sys/fs/cgroup"
	}
	if o.UID <= 0 || o.GID < 0 {
		return nil, fmt.Errorf("hand over scope: uid %d gid %d: want the agent's non-root user", o.UID, o.GID)
	}
	if !path.IsAbs(cg) || path.Clean(cg) != cg || cg == "/" {
		return nil, fmt.Errorf("hand over scope: %q is not a cgroup below the root", cg)
	}
	kind, err := detect(o.Root)
	if err != nil {
		return nil, fmt.Errorf("hand over scope: %w", err)
	}
	if kind == kindUnified {
		dir := join(o.Root, cg)
		if err := chownTree(dir, unix.CGROUP2_SUPER_MAGIC, scopeV2Files, o.UID, o.GID); err != nil {
			return nil, fmt.Errorf("hand over scope: %w", err)
		}
		return []string{dir}, nil
	}
	self, err := readSelf(o.ProcSelfCgroup)
	if err != nil {
		return nil, err
	}
	ctrls, _ := v1Ctrls(o.Root, self)
	var dirs []string
	for _, c := range ctrls {
		dir := join(o.Root, c, cg)
		if err := handOver(dir, o.UID, o.GID); err != nil {
			return dirs, fmt.Errorf("hand over scope: %s: %w", c, err)
		}
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

// chownTree chowns dir and files after checking dir (checkCgroupDir).
// Nothing is followed.
func chownTree(dir string, magic int64, files []string, uid, gid int) error {
	if err := checkCgroupDir(dir, magic); err != nil {
		return err
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return err
	}
	for _, f := range files {
		if err := os.Lchown(join(dir, f), uid, gid); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}

// checkCgroupDir refuses dir unless it is a directory (not a link) on a
// filesystem of type magic.
func checkCgroupDir(dir string, magic int64) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if int64(st.Type) != magic {
		kind := "cgroup v1"
		if magic == unix.CGROUP2_SUPER_MAGIC {
			kind = "cgroup v2"
		}
		return fmt.Errorf("%s is not on a %s filesystem", dir, kind)
	}
	return nil
}

// ErrScopeElsewhere says the cells' scope is not in the unit's slice: a
// scope an earlier version created in the unit's former slice.
var ErrScopeElsewhere = errors.New("the cells' scope is not in the unit's slice")

// HandOverSlice hands the cgroup.procs of the common ancestor of the unit's
// cgroup and the cells' scope cg to UID:GID, on a cgroup v2 host, so that a
// non-root agent may start processes in the scope from its own unit (the
// common-ancestor rule, checkCommonAncestor). Only that one file, and only
// where the ancestor is a slice that holds nothing but the unit and the
// scope: with the cgroup.procs of a shared slice (system.slice) the agent
// could pull any process of that slice into a cgroup of its own. A process
// cannot be placed in the slice's own cgroup either way (its children have
// controllers), nor moved out of it (that needs the root's). It returns the
// file handed over, or "" where there is nothing to hand (a hybrid host,
// where the rule does not apply to the v1 controllers the cells use; or the
// scope inside the unit's cgroup).
func HandOverSlice(o PrepareOptions, cg string) (string, error) {
	if o.Root == "" {
		o.Root = "/sys/fs/cgroup"
	}
	if o.UID <= 0 || o.GID < 0 {
		return "", fmt.Errorf("hand over slice: uid %d gid %d: want the agent's non-root user", o.UID, o.GID)
	}
	if !path.IsAbs(cg) || path.Clean(cg) != cg || cg == "/" {
		return "", fmt.Errorf("hand over slice: %q is not a cgroup below the root", cg)
	}
	kind, err := detect(o.Root)
	if err != nil {
		return "", fmt.Errorf("hand over slice: %w", err)
	}
	if kind != kindUnified {
		return "", nil
	}
	self, err := readSelf(o.ProcSelfCgroup)
	if err != nil {
		return "", err
	}
	unit, err := unitCgroup(self, "")
	if err != nil {
		return "", err
	}
	anc := commonAncestor(unit, cg)
	if anc == unit || anc == cg {
		return "", nil
	}
	if anc != path.Dir(unit) || anc != path.Dir(cg) {
		return "", fmt.Errorf("hand over slice: %w: the cells' scope %s, the unit %s", ErrScopeElsewhere, cg, unit)
	}
	if anc == "/" {
		return "", fmt.Errorf("hand over slice: the unit %s and the cells' scope %s meet only at the root cgroup: put both in a slice of their own (Slice=cellvisor.slice)", unit, cg)
	}
	own := map[string]bool{childOf(anc, unit): true, childOf(anc, cg): true}
	ents, err := os.ReadDir(join(o.Root, anc))
	if err != nil {
		return "", fmt.Errorf("hand over slice: %w", err)
	}
	var others []string
	for _, e := range ents {
		if e.IsDir() && !own[e.Name()] {
			others = append(others, e.Name())
		}
	}
	if len(others) > 0 {
		return "", fmt.Errorf("hand over slice: %s holds other units too (%s): handing its cgroup.procs to the agent would let it move their processes; give the unit a slice of its own (Slice=cellvisor.slice, as packaged)", anc, strings.Join(others, ", "))
	}
	dir := join(o.Root, anc)
	if err := checkCgroupDir(dir, unix.CGROUP2_SUPER_MAGIC); err != nil {
		return "", fmt.Errorf("hand over slice: %w", err)
	}
	f := join(dir, "cgroup.procs")
	if err := os.Lchown(f, o.UID, o.GID); err != nil {
		return "", fmt.Errorf("hand over slice: %w", err)
	}
	return f, nil
}

// childOf is the first component of p below its ancestor anc.
func childOf(anc, p string) string {
	rest := strings.TrimPrefix(strings.TrimPrefix(p, anc), "/")
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	return rest
}
