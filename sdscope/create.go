package sdscope

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"
)

// HolderLeaf is the holder's cgroup inside the scope. On cgroup v2 a cgroup
// whose children get controllers may hold no process itself, so the holder
// that keeps the scope alive sits in a leaf of its own beside the cells.
const HolderLeaf = "holder"

// HolderCommand is the agent's own hidden command that holds the scope.
const HolderCommand = "scope-holder"

// CreateOptions configures Create.
type CreateOptions struct {
	// Name is the scope, e.g. cellvisor-cells.scope.
	Name string
	// Unit is the agent's unit; the scope goes in its slice.
	Unit string
	// Holder is the holder's command line, or nil for this executable's
	// HolderCommand.
	Holder []string
	// UID and GID run the holder (the agent's user, so that a non-root agent
	// can end it); negative keeps this process's.
	UID, GID int
	// Root is the cgroup filesystem mount, or "" for /sys/fs/cgroup.
	Root string
}

// Create starts the holder, creates the scope around it with Delegate=yes
// in the unit's slice, waits for systemd's job, and moves the holder into
// the scope's HolderLeaf in every hierarchy the cells use. The holder is not
// this process's to wait for: it outlives it (its parent becomes init).
func (c *Conn) Create(ctx context.Context, o CreateOptions) (Scope, error) {
	if o.Root == "" {
		o.Root = "/sys/fs/cgroup"
	}
	slice, err := c.stringProp(ctx, o.Unit, "Service", "Slice")
	if err != nil {
		return Scope{}, fmt.Errorf("create %s: slice of %s: %w", o.Name, o.Unit, err)
	}
	holder, err := startHolder(o)
	if err != nil {
		return Scope{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = holder.Process.Kill()
			_ = holder.Wait()
		}
	}()
	props := []sddbus.Property{
		{Name: "Description", Value: dbus.MakeVariant("cellvisor cells (outlive " + o.Unit + " restarts)")},
		sddbus.PropSlice(slice),
		{Name: "Delegate", Value: dbus.MakeVariant(true)},
		sddbus.PropPids(uint32(holder.Process.Pid)),
		// Stopping the scope (the cells are stopped for good) is a
		// graceful matter for the agent; systemd only cleans up.
		{Name: "KillMode", Value: dbus.MakeVariant("control-group")},
		// Ordered before the agent's unit: at a shutdown systemd stops
		// units in the reverse of their start order, so the agent is
		// stopped first, and drains and stops the cells itself, before
		// systemd stops the scope (which by then holds nothing). Without
		// it both stop at once and the cells get systemd's SIGTERM.
		{Name: "Before", Value: dbus.MakeVariant([]string{o.Unit})},
	}
	done := make(chan string, 1)
	if _, err := c.c.StartTransientUnitContext(ctx, o.Name, "fail", props, done); err != nil {
		if isAccessDenied(err) {
			return Scope{}, fmt.Errorf("create %s: %w (a non-root agent needs the scope created by cellvisor prepare-cgroups, ExecStartPre=+)", o.Name, err)
		}
		return Scope{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	select {
	case res := <-done:
		if res != "done" {
			return Scope{}, fmt.Errorf("create %s: job %s", o.Name, res)
		}
	case <-ctx.Done():
		return Scope{}, fmt.Errorf("create %s: waiting for systemd's job: %w", o.Name, ctx.Err())
	}
	s, err := c.Find(ctx, o.Name)
	if err != nil {
		return Scope{}, err
	}
	if err := moveToLeaf(o.Root, s.ControlGroup, holder.Process.Pid); err != nil {
		return Scope{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	ok = true
	// The holder lives on after this process; its exit status goes to
	// whoever is its parent then. Wait in the background while we are.
	go func() { _ = holder.Wait() }()
	return s, nil
}

func startHolder(o CreateOptions) (*exec.Cmd, error) {
	argv := o.Holder
	if len(argv) == 0 {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("holder: %w", err)
		}
		argv = []string{self, HolderCommand}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	// No terminal, no inherited descriptors, a session of its own: nothing
	// of the agent's stays open in a process that outlives it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if o.UID >= 0 && o.GID >= 0 && (o.UID != os.Geteuid() || o.GID != os.Getegid()) {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(o.UID), Gid: uint32(o.GID)}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start holder %s: %w", argv[0], err)
	}
	return cmd, nil
}

// Dirs are the scope's cgroup directories the cells use: the unified one
// (the mount itself on a v2 host, unified/ on a hybrid one) and the v1
// memory, cpu, cpuacct and pids ones, where they exist. Never name=systemd.
func Dirs(root, cg string) []string {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return []string{filepath.Join(root, cg)}
	}
	var out []string
	for _, h := range []string{"unified", "memory", "cpu", "cpuacct", "pids"} {
		fi, err := os.Lstat(filepath.Join(root, h))
		if err != nil || !fi.IsDir() {
			continue // absent, or a link to a co-mounted hierarchy
		}
		if d := filepath.Join(root, h, cg); isDir(d) {
			out = append(out, d)
		}
	}
	return out
}

func isDir(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

// moveToLeaf moves pid into HolderLeaf in every one of the scope's dirs.
func moveToLeaf(root, cg string, pid int) error {
	dirs := Dirs(root, cg)
	if len(dirs) == 0 {
		return fmt.Errorf("scope cgroup %s: no directory under %s", cg, root)
	}
	for _, d := range dirs {
		leaf := filepath.Join(d, HolderLeaf)
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("holder leaf: %w", err)
		}
		// Readable by the agent whatever the umask of the caller (the
		// unit's UMask=0027 applies to its ExecStartPre=+ too): the agent
		// finds the holder by this leaf's cgroup.procs when it ends the
		// scope.
		if err := os.Chmod(leaf, 0o755); err != nil {
			return fmt.Errorf("holder leaf: %w", err)
		}
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("move holder into %s: %w", leaf, err)
		}
	}
	return nil
}

// ShowHolderLeaf makes the scope's holder leaf readable by the agent in
// every hierarchy: a scope made by an earlier version under a umask of
// 0027 has it root's alone, and the agent could then not find (nor end)
// its holder. A leaf that is missing is left so.
func ShowHolderLeaf(root, cg string) error {
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	for _, d := range Dirs(root, cg) {
		if err := os.Chmod(filepath.Join(d, HolderLeaf), 0o755); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("holder leaf: %w", err)
		}
	}
	return nil
}

// Holders lists the processes in the scope's holder leaf.
func Holders(root, cg string) []int {
	seen := map[int]bool{}
	var out []int
	for _, d := range Dirs(root, cg) {
		b, err := os.ReadFile(filepath.Join(d, HolderLeaf, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range splitFields(b) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

func splitFields(b []byte) []string {
	var out []string
	start := -1
	for i, c := range b {
		if c == ' ' || c == '\n' || c == '\t' {
			if start >= 0 {
				out = append(out, string(b[start:i]))
				start = -1
			}
			continue
		}
		if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		out = append(out, string(b[start:]))
	}
	return out
}

// Stop asks systemd to stop the scope name (its KillMode: every process in
// it gets SIGTERM, then SIGKILL) and waits for the job, bounded by ctx.
func (c *Conn) Stop(ctx context.Context, name string) error {
	done := make(chan string, 1)
	if _, err := c.c.StopUnitContext(ctx, name, "replace", done); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	select {
	case res := <-done:
		if res != "done" {
			return fmt.Errorf("stop %s: job %s", name, res)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop %s: waiting for systemd's job: %w", name, ctx.Err())
	}
}

// Release ends the scope once its cells are stopped for good: it kills the
// holder (found by its leaf, never by name), waits, bounded by ctx, until the
// leaf is empty, removes the leaf, and asks systemd to stop the scope (an
// empty scope stops by itself; a non-root agent may not ask, and need not).
func (c *Conn) Release(ctx context.Context, root string, s Scope) error {
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	for {
		pids := Holders(root, s.ControlGroup)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("release %s: holder %v still running: %w", s.Name, pids, ctx.Err())
		case <-t.C:
		}
	}
	var errs []error
	for _, d := range Dirs(root, s.ControlGroup) {
		if err := os.Remove(filepath.Join(d, HolderLeaf)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if c != nil {
		done := make(chan string, 1)
		if _, err := c.c.StopUnitContext(ctx, s.Name, "replace", done); err == nil {
			select {
			case <-done:
			case <-ctx.Done():
			}
		} else if !isAccessDenied(err) {
			errs = append(errs, fmt.Errorf("stop %s: %w", s.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("release %s: %w", s.Name, err)
	}
	return nil
}
