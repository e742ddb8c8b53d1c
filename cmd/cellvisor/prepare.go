package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/internal/cli"
	"cellvisor/sdscope"
)

// prepareCmd is the unit's privileged pre-start step on hybrid hosts.
func prepareCmd(stdout io.Writer) *cobra.Command {
	var userName, root, scope string
	cmd := &cobra.Command{
		Use:   "prepare-cgroups",
		Short: "as root, before the agent starts: hand the unit's v1 memory, cpu and pids cgroups to the agent's user",
		Long: `On a hybrid cgroup host systemd's Delegate=yes hands only the unified hierarchy to the
unit's user; the agent enforces cell limits through the v1 memory, cpu and pids
controllers. Run as root from the unit (ExecStartPre=+), this hands the unit's own
cgroup in each of those hierarchies (and cpuacct's, where it is mounted apart) to
--user: the directory and its cgroup.procs and tasks files, nothing else; never
name=systemd. On a cgroup v2 host there is nothing of the unit's to hand over.

Under systemd (cgroup.scope auto or on) it then finds, or creates, the cells' delegated
systemd scope (cellvisor-cells.scope, in the unit's slice, with a holder process running
as --user) and hands the scope's cgroup to --user the same way (on a v2 host its unified
directory), so that a non-root agent can run its cells there: they outlive a restart of
the unit. A non-root agent cannot create a scope over the system bus by itself.`,
		Example: "  ExecStartPre=+/usr/bin/cellvisor prepare-cgroups --user cellvisor",
		Args:    cli.ExactArgs(0),
		RunE: func(*cobra.Command, []string) error {
			uid, gid, err := lookupUser(userName)
			if err != nil {
				return err
			}
			o := cgroup.PrepareOptions{Root: root, UID: uid, GID: gid}
			dirs, err := cgroup.PrepareV1(o)
			if errors.Is(err, cgroup.ErrNoV1) {
				if _, werr := fmt.Fprintf(stdout, "prepare-cgroups: no v1 hierarchy of the unit's to hand over: %v\n", err); werr != nil {
					return werr
				}
			} else if err != nil {
				return err
			}
			sdirs, err := prepareScope(scope, o)
			if err != nil {
				return err
			}
			for _, d := range append(dirs, sdirs...) {
				if _, err := fmt.Fprintf(stdout, "prepare-cgroups: %s handed to %s (%d:%d)\n", d, userName, uid, gid); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&userName, "user", "cellvisor", "the agent's user (its primary group too): a name or a numeric uid")
	cmd.Flags().StringVar(&root, "cgroup-root", "/sys/fs/cgroup", "the cgroup filesystem mount")
	cmd.Flags().StringVar(&scope, "scope", config.ScopeAuto, "the cells' systemd scope: auto (under systemd, when the system bus answers), on (fail without it), off")
	return cmd
}

// prepareScope finds or creates the cells' scope and hands it to o's user;
// nothing where mode (cgroup.scope) says there is to be no scope.
func prepareScope(mode string, o cgroup.PrepareOptions) ([]string, error) {
	switch mode {
	case config.ScopeOff:
		return nil, nil
	case config.ScopeAuto:
		if !sdscope.UnderSystemd() {
			return nil, nil
		}
	case config.ScopeOn:
	default:
		return nil, fmt.Errorf("--scope %q: want auto, on or off", mode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dirs, err := ensureScope(ctx, o, nil)
	if err != nil && mode == config.ScopeAuto {
		// The agent (cgroup.scope: auto) then keeps its cells in its unit
		// and says so; a start must not fail for it.
		fmt.Fprintf(os.Stderr, "prepare-cgroups: no scope for the cells: %v\n", err)
		return nil, nil
	}
	return dirs, err
}

// ensureScope finds or creates the scope, with holder (nil: this binary's
// scope-holder) running as o's user, and hands it over.
func ensureScope(ctx context.Context, o cgroup.PrepareOptions, holder []string) ([]string, error) {
	conn, err := sdscope.Dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	unit, err := conn.OwnUnit(ctx)
	if err != nil {
		return nil, err
	}
	name := sdscope.ScopeName(unit)
	create := func() (sdscope.Scope, error) {
		return conn.Create(ctx, sdscope.CreateOptions{Name: name, Unit: unit, Holder: holder, UID: o.UID, GID: o.GID, Root: o.Root})
	}
	s, err := conn.Find(ctx, name)
	if errors.Is(err, sdscope.ErrNotFound) {
		s, err = create()
	}
	if err != nil {
		return nil, err
	}
	slice, err := cgroup.HandOverSlice(o, s.ControlGroup)
	if errors.Is(err, cgroup.ErrScopeElsewhere) {
		// A scope an earlier version made in the unit's former slice
		// (system.slice): on a cgroup v2 host no cell could start there
		// as a non-root agent (the common-ancestor rule), so it holds
		// nothing but its holder. Stop it and make the scope anew.
		fmt.Fprintf(os.Stderr, "prepare-cgroups: %v: stopping it and creating it in the unit's slice\n", err)
		if err = conn.Stop(ctx, name); err == nil {
			if s, err = create(); err == nil {
				slice, err = cgroup.HandOverSlice(o, s.ControlGroup)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	dirs, err := cgroup.HandOverScope(o, s.ControlGroup)
	if err != nil {
		return nil, err
	}
	if err := sdscope.ShowHolderLeaf(o.Root, s.ControlGroup); err != nil {
		return nil, err
	}
	if slice != "" {
		dirs = append(dirs, slice)
	}
	return dirs, nil
}

// lookupUser returns name's uid and primary gid; name may be numeric.
func lookupUser(name string) (uid, gid int, err error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, nerr := strconv.Atoi(name); nerr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: %w", name, err)
	}
	if uid, err = strconv.Atoi(u.Uid); err != nil {
		return 0, 0, fmt.Errorf("user %q: uid %q: %w", name, u.Uid, err)
	}
	if gid, err = strconv.Atoi(u.Gid); err != nil {
		return 0, 0, fmt.Errorf("user %q: gid %q: %w", name, u.Gid, err)
	}
	return uid, gid, nil
}
