package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The limits are written as containerd's cgroups library (v3.1.3) wrote
// them when the agent used it: the same files, values, order and errors.

// setting is one limit file and the value written to it.
type setting struct {
	ctrl  string // the v1 hierarchy holding file ("" on v2)
	file  string
	value string
}

// v1Settings are the files a v1 group's limits go to, in the order they
// are written: memory, then cpu, then pids (the hierarchies' order in
// v1Controllers, each created just before its files are written). The
// period goes before the quota. The kernel checks each write against the
// other value already there (a quota of at least 1 ms and no lower than
// the burst; on v1 a quota/period ratio no higher than the parent's nor
// lower than a child's), so no fixed order suits every change; period
// first is containerd's. A quota below 0 is
// written as is: -1 is v1's "no quota". A PIDs limit of 0 or less is
// "max", none (containerd left pids.max alone there, which a new group
// reads as "max" too, but an update to no limit did not lift the old one).
// The memory limit is written as is, memsw untouched: a limit below what
// the group uses makes the kernel reclaim, and fail the write with EBUSY
// where it cannot.
func v1Settings(l Limits) []setting {
	return []setting{
		{"memory", "memory.limit_in_bytes", strconv.FormatInt(l.MemoryBytes, 10)},
		{"cpu", "cpu.cfs_period_us", strconv.FormatUint(l.CPUPeriodUS, 10)},
		{"cpu", "cpu.cfs_quota_us", strconv.FormatInt(l.CPUQuotaUS, 10)},
		{"pids", "pids.max", pidsMax(l.PIDs)},
	}
}

// pidsMax formats pids.max: the limit, or "max" (none) for 0 or less.
func pidsMax(pids int64) string {
	if pids <= 0 {
		return "max"
	}
	return strconv.FormatInt(pids, 10)
}

// v2Settings are the files a v2 group's limits go to, in the order they
// are written: cpu.max, memory.max, pids.max (0 or less: "max", as on
// v1). The memory limit is written as is.
func v2Settings(l Limits) []setting {
	return []setting{
		{"", "cpu.max", cpuMax(l.CPUQuotaUS, l.CPUPeriodUS)},
		{"", "memory.max", strconv.FormatInt(l.MemoryBytes, 10)},
		{"", "pids.max", pidsMax(l.PIDs)},
	}
}

// cpuMax formats cpu.max: "$QUOTA $PERIOD", the quota "max" (none) when
// below 0. The period is always written.
func cpuMax(quotaUS int64, periodUS uint64) string {
	q := "max"
	if quotaUS >= 0 {
		q = strconv.FormatInt(quotaUS, 10)
	}
	return q + " " + strconv.FormatUint(periodUS, 10)
}

// makeGroupDir creates the group directory dir (its parents too, where
// missing) and tells whether it was there already. An existing group's
// limits are updated in place, and there the caller first clears its CPU
// burst: the agent gives a cell a burst equal to its quota, and the kernel
// refuses a quota below the burst already there, so a cell's CPU limit
// lowered live would fail with EINVAL. The burst is written again after
// the quota.
func makeGroupDir(dir string) (existed bool, err error) {
	err = os.Mkdir(dir, 0o755)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, fs.ErrExist):
		return true, nil
	}
	return false, os.MkdirAll(dir, 0o755)
}

// v2Controllers is what ensureAt enables in cgroup.subtree_control above
// a group, in containerd's order.
const v2Controllers = "+cpu +memory +pids"

// subtreeControlFiles are the cgroup.subtree_control files of dir's
// ancestors from the mount root down to its parent, dir excluded: the
// ones a group needs its controllers enabled in. (An ancestor counts when
// its path starts with root as a string, as in containerd.)
func subtreeControlFiles(root, dir string) []string {
	var out []string
	split := strings.Split(dir, "/")
	for i := range split {
		f := strings.Join(split[:i], "/")
		if !strings.HasPrefix(f, root) || f == dir {
			continue
		}
		out = append(out, filepath.Join(f, "cgroup.subtree_control"))
	}
	return out
}

// enableControllers enables memory, cpu and pids in every ancestor of dir
// below the mount (subtreeControlFiles), top down. Only the parent's
// write decides: an ancestor above it may refuse (one not delegated to
// this user, or one that already has them) as long as the parent has
// them, which its write then tells.
func enableControllers(root, dir string) error {
	var err error
	for _, f := range subtreeControlFiles(root, dir) {
		if werr := writeFile(f, v2Controllers); werr != nil {
			err = fmt.Errorf("enable controllers %s in %s: %w", v2Controllers, f, werr)
		} else {
			err = nil
		}
	}
	return err
}

// checkGroupPath refuses a v2 group path that is not clean and absolute
// (relative to the mount), or that starts with /sys/fs/cgroup (a mount
// path mistaken for a group's).
func checkGroupPath(g string) error {
	if !strings.HasPrefix(g, "/") || filepath.Clean(g) != g || strings.HasPrefix(g, "/sys/fs/cgroup") {
		return fmt.Errorf("invalid group path %q", g)
	}
	return nil
}

// killTree SIGKILLs every process in the v2 cgroup dir and below it:
// by cgroup.kill (Linux 5.14+), or where writing that fails, by freezing
// the group, signalling each process and thawing it.
func killTree(ctx context.Context, dir string, kill func(pids []int)) error {
	if err := writeFile(filepath.Join(dir, "cgroup.kill"), "1"); err == nil {
		return nil
	}
	return freezeKill(ctx, dir, kill)
}

// freezeKill is killTree before cgroup.kill: frozen, the group cannot
// fork between the reading of its processes and their SIGKILLs. A kernel
// without cgroup.freeze (before 5.2) has them signalled unfrozen. It
// does not wait for the killed: the caller does.
func freezeKill(ctx context.Context, dir string, kill func(pids []int)) error {
	_ = setFrozen(ctx, dir, true)
	pids, err := treeProcs(dir)
	if err != nil {
		_ = setFrozen(ctx, dir, false)
		return err
	}
	kill(pids)
	_ = setFrozen(ctx, dir, false)
	return nil
}

// setFrozen writes cgroup.freeze and reads it back until it holds the
// state written, bounded by ctx.
func setFrozen(ctx context.Context, dir string, frozen bool) error {
	f, want := filepath.Join(dir, "cgroup.freeze"), "0"
	if frozen {
		want = "1"
	}
	for {
		if err := writeFile(f, want); err != nil {
			return err
		}
		got, err := readFile(f)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(got)) == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// treeProcs lists the processes of the v2 cgroup dir and of every cgroup
// below it. A cgroup below dir that goes away meanwhile is skipped; dir
// itself missing is an error (ENOENT).
func treeProcs(dir string) ([]int, error) {
	var out []int
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != dir && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		if d.Name() != "cgroup.procs" {
			return nil
		}
		pids, err := readProcs(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		out = append(out, pids...)
		return nil
	})
	return out, err
}
