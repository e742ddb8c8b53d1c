// Package cgroup creates, limits, measures, kills and removes the per-cell
// cgroups under the agent's own delegated subtree, and places the agent in its
// own limited leaf beside them. It speaks cgroup v2 (cells are cloned straight
// into their cgroup) and, on hybrid hosts, the v1 memory, cpu and pids
// controllers (cells are exec'd from inside their cgroups by a tiny join
// helper, see cgexec). It never creates a cgroup outside the subtree and
// never moves a process in the name=systemd hierarchy. Only supervisor,
// agent, cmd/cellvisor, cmd/cellvisor-demo and the tests' harness
// (testkit/testutil) import it.
package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path"
	"strings"
)

// Mode is how cell limits are enforced on this host.
type Mode string

// Modes, as shown in status.
const (
	ModeV2         Mode = "v2"
	ModeV1Hybrid   Mode = "v1-hybrid"
	ModeUnenforced Mode = "unenforced"
)

// AgentLeaf is the name of the agent's own leaf cgroup inside the subtree.
const AgentLeaf = "agent"

// ErrNotEmpty is returned when a group still holds processes after a kill.
var ErrNotEmpty = errors.New("cgroup still has processes")

// IsCellName reports whether name is a cell group name (cell-NN): the groups
// this package creates for cells; anything else under the subtree is not
// ours and is left alone.
func IsCellName(name string) bool {
	return len(name) == len("cell-00") && strings.HasPrefix(name, "cell-") && isDigit(name[5]) && isDigit(name[6])
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// Limits are hard resource limits for one group.
type Limits struct {
	// MemoryBytes is the memory limit (memory.max / memory.limit_in_bytes).
	MemoryBytes int64 `json:"memory_bytes"`
	// CPUQuotaUS and CPUPeriodUS are the CFS bandwidth (cpu.max / cfs_quota_us).
	CPUQuotaUS  int64  `json:"cpu_quota_us"`
	CPUPeriodUS uint64 `json:"cpu_period_us"`
	// PIDs is the task limit (pids.max); 0 means unlimited.
	PIDs int64 `json:"pids"`
	// CPUBurstUS lets a group spend quota it left unused in earlier periods
	// in a burst (cpu.max.burst / cpu.cfs_burst_us, kernel 5.14+; skipped
	// where the kernel lacks it). The long-run average stays at the quota.
	CPUBurstUS uint64 `json:"cpu_burst_us,omitempty"`
}

// DefaultWeight is the CPU weight of every cell's group, and the agent's
// own once its cells are up (WeighSelf).
const DefaultWeight = 100

// CPULimits converts a CPU count into quota and period (period 100ms).
func CPULimits(cpus float64) (quotaUS int64, periodUS uint64) {
	const period = 100000
	return int64(cpus*period + 0.5), period
}

// Usage is a group's current resource use, read from its cgroup files.
type Usage struct {
	MemoryBytes   uint64 `json:"memory_bytes"`
	MemoryLimit   uint64 `json:"memory_limit"`
	OOMKills      uint64 `json:"oom_kills"`
	PIDs          uint64 `json:"pids"`
	PIDsLimit     uint64 `json:"pids_limit"`
	PIDsRefused   uint64 `json:"pids_refused"`
	CPUUsageNS    uint64 `json:"cpu_usage_ns"`
	CPUThrottled  uint64 `json:"cpu_throttled_periods"`
	CPUThrottleNS uint64 `json:"cpu_throttled_ns"`
}

// Manager owns the agent's subtree.
type Manager interface {
	// Mode says how limits are enforced.
	Mode() Mode
	// Reason says why the mode is unenforced (nil otherwise).
	Reason() error
	// Path is the subtree, relative to the cgroup mount (v1: the memory hierarchy).
	Path() string
	// PrepareSelf readies the agent leaf with l. On v2 it creates the leaf
	// and moves the calling process into it, at once: controllers can be
	// handed to children only by a cgroup without processes of its own.
	// On v1 both wait for MoveSelf.
	PrepareSelf(l Limits) error
	// MoveSelf moves the calling process into the agent leaf, if it is not
	// there yet (v1), creating the leaf first where PrepareSelf left that
	// to it. Moving a whole process waits out an RCU grace period while
	// holding the kernel's cgroup lock, which every cell's join and every
	// group's creation needs: the agent does it once its cells have
	// started.
	MoveSelf() error
	// LimitSelf sets l on the agent leaf, after PrepareSelf (a CPU quota
	// below 0 is none).
	LimitSelf(l Limits) error
	// WeighSelf sets the agent leaf's CPU weight, after PrepareSelf, in
	// cgroup v2 units: 1 to 10000, where 100 (DefaultWeight) is every
	// cell's. It decides who runs first when the agent and its cells
	// want the CPU at once; the quotas still cap both.
	WeighSelf(weight int) error
	// Ensure creates the named group, or updates it, with l.
	Ensure(name string, l Limits) (Group, error)
	// Open returns an existing group without changing it.
	Open(name string) (Group, error)
	// List returns the cell groups present under the subtree.
	List() ([]string, error)
	// Remove removes the subtree itself once it is empty of cells (best effort
	// for the agent leaf, which holds the caller).
	Remove() error
	// Lock takes the subtree for this process until the returned closer is
	// closed or the process exits; ErrLocked when another process holds it.
	// Nothing that changes a cell may happen before it.
	Lock() (io.Closer, error)
}

// Group is one cell's cgroup.
type Group interface {
	Name() string
	// Path is the group relative to the cgroup mount (v1: the memory
	// hierarchy's).
	Path() string
	// Paths is the group's path in each hierarchy it spans, by controller
	// ("unified" on v2; nil when nothing is enforced).
	Paths() map[string]string
	// Prepare makes cmd start inside the group. Call after, when not nil, once
	// cmd.Start has returned (successful or not). A cmd.SysProcAttr.Credential
	// is the user the cell runs as: the group has the join helper become it
	// once the cell is inside (cgexec.Cred).
	Prepare(cmd *exec.Cmd) (after func(started bool), err error)
	// Procs lists the processes in the group.
	Procs() ([]int, error)
	// Kill SIGKILLs every process in the group and waits, bounded by ctx,
	// until the group is empty.
	Kill(ctx context.Context) error
	// Delete kills what is left and removes the group.
	Delete(ctx context.Context) error
	// Usage reads current resource use.
	Usage() (Usage, error)
	// Limits reads the limits back from the cgroup files.
	Limits() (Limits, error)
}

// Condemn SIGKILLs every process of g but keep (0: none; a standby of a
// StandbyGroup) and returns once none of them can run or fork any more,
// without waiting for the kernel to tear them down: their memory and pids
// stay charged to the group for that while, and a port one of them holds
// stays bound. A group that cannot tell that moment is killed with Kill,
// which waits.
func Condemn(ctx context.Context, g Group, keep int) error {
	if c, ok := g.(interface {
		Condemn(ctx context.Context, keep int) error
	}); ok {
		return c.Condemn(ctx, keep)
	}
	if sg, ok := g.(StandbyGroup); ok && keep != 0 {
		return sg.KillExcept(ctx, keep)
	}
	return g.Kill(ctx)
}

// Options configures New.
type Options struct {
	// Root is the cgroup filesystem mount, or "" for /sys/fs/cgroup.
	Root string
	// Subtree is created below the process's own cgroup; "" uses it directly.
	Subtree string
	// ProcSelfCgroup is the content of /proc/self/cgroup, or nil to read it.
	ProcSelfCgroup []byte
	// Cells is the cgroup, relative to the mount and the same in every
	// hierarchy, that holds the cells (and Subtree, when set) instead of
	// the agent's own: the ControlGroup of the delegated systemd scope the
	// cells outlive the agent in (package sdscope). "" keeps them beside the
	// agent, in its own cgroup. The agent's leaf stays in its own cgroup.
	Cells string
}

// New detects the host's cgroup layout and returns a manager for the agent's
// subtree. Where limits cannot be enforced it returns an unenforced manager
// whose Reason says why; it returns an error only for a malformed environment.
func New(o Options) (Manager, error) {
	if o.Root == "" {
		o.Root = "/sys/fs/cgroup"
	}
	self, err := readSelf(o.ProcSelfCgroup)
	if err != nil {
		return nil, err
	}
	self = stripSubtree(self, o.Subtree)
	if o.Cells != "" && (!path.IsAbs(o.Cells) || path.Clean(o.Cells) != o.Cells || o.Cells == "/") {
		return nil, fmt.Errorf("cells cgroup %q: want a clean absolute path below the root", o.Cells)
	}
	kind, err := detect(o.Root)
	if err != nil {
		return newNone(fmt.Errorf("detect cgroup layout under %s: %w", o.Root, err)), nil
	}
	switch kind {
	case kindUnified:
		m, err := newV2(o.Root, self, o.Subtree, o.Cells)
		if err != nil {
			return newNone(err), nil
		}
		return m, nil
	case kindV1:
		m, err := newV1(o.Root, self, o.Subtree, o.Cells)
		if err != nil {
			return newNone(err), nil
		}
		return m, nil
	}
	return newNone(fmt.Errorf("no usable cgroup hierarchy under %s", o.Root)), nil
}

// Start starts cmd inside g: Prepare, Start, then the after hook, whatever
// Start returned.
func Start(g Group, cmd *exec.Cmd) error {
	after, err := g.Prepare(cmd)
	if err != nil {
		return err
	}
	err = cmd.Start()
	if after != nil {
		after(err == nil)
	}
	return err
}
