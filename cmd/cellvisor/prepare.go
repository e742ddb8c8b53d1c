package main

import (
	"errors"
	"fmt"
	"io"
	"os/user"
	"strconv"

	"github.com/spf13/cobra"

	"cellvisor/cgroup"
	"cellvisor/internal/cli"
)

// prepareCmd is the unit's privileged pre-start step on hybrid hosts.
func prepareCmd(stdout io.Writer) *cobra.Command {
	var userName, root string
	cmd := &cobra.Command{
		Use:   "prepare-cgroups",
		Short: "as root, before the agent starts: hand the unit's v1 memory, cpu and pids cgroups to the agent's user",
		Long: `On a hybrid cgroup host systemd's Delegate=yes hands only the unified hierarchy to the
unit's user; the agent enforces cell limits through the v1 memory, cpu and pids
controllers. Run as root from the unit (ExecStartPre=+), this hands the unit's own
cgroup in each of those hierarchies (and cpuacct's, where it is mounted apart) to
--user: the directory and its cgroup.procs and tasks files, nothing else; never
name=systemd. On a cgroup v2 host it does nothing.`,
		Example: "  ExecStartPre=+/usr/bin/cellvisor prepare-cgroups --user cellvisor",
		Args:    cli.ExactArgs(0),
		RunE: func(*cobra.Command, []string) error {
			uid, gid, err := lookupUser(userName)
			if err != nil {
				return err
			}
			dirs, err := cgroup.PrepareV1(cgroup.PrepareOptions{Root: root, UID: uid, GID: gid})
			if errors.Is(err, cgroup.ErrNoV1) {
				_, werr := fmt.Fprintf(stdout, "prepare-cgroups: nothing to do: %v\n", err)
				return werr
			}
			if err != nil {
				return err
			}
			for _, d := range dirs {
				if _, err := fmt.Fprintf(stdout, "prepare-cgroups: %s handed to %s (%d:%d)\n", d, userName, uid, gid); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&userName, "user", "cellvisor", "the agent's user (its primary group too): a name or a numeric uid")
	cmd.Flags().StringVar(&root, "cgroup-root", "/sys/fs/cgroup", "the cgroup filesystem mount")
	return cmd
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
