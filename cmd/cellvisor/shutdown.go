package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/config"
	"cellvisor/internal/cli"
)

// shutdownCmd stops every cell gracefully and ends the agent.
func shutdownCmd(load func() (config.Agent, error), stdout io.Writer) *cobra.Command {
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "shutdown",
		Short: "stop every cell gracefully and end the agent",
		Long: `Ask the running agent, through its admin socket, to stop every cell gracefully (SIGQUIT,
openresty.stop_timeout, then kill), remove their cgroups and end, then wait until it has
ended. Unlike a SIGTERM under systemd, which leaves the cells running when systemd is
restarting the unit, this always stops them. Under systemd the agent then exits with
status 0, so Restart=on-failure does not start it again: use systemctl start cellvisor.`,
		Example: "  cellvisor shutdown\n  cellvisor shutdown --timeout 5m",
		Args:    cli.ExactArgs(0),
	}
	c.Flags().DurationVar(&timeout, "timeout", 0, "how long to wait for the agent to end (0: openresty.stop_timeout plus a minute)")
	c.RunE = func(c *cobra.Command, _ []string) error {
		cfg, err := load()
		if err != nil {
			return err
		}
		if timeout <= 0 {
			timeout = cfg.OpenResty.StopTimeout.D() + time.Minute
		}
		ctx, cancel := context.WithTimeout(c.Context(), timeout)
		defer cancel()
		pid, err := adminsock.NewClient(agent.AdminSocket(cfg)).Shutdown(ctx)
		if err != nil {
			return fmt.Errorf("shutdown: %w", err)
		}
		if _, err := fmt.Fprintf(stdout, "shutdown: agent %d is stopping its cells\n", pid); err != nil {
			return err
		}
		if err := waitExit(ctx, pid); err != nil {
			return fmt.Errorf("shutdown: agent %d: %w", pid, err)
		}
		_, err = fmt.Fprintf(stdout, "shutdown: agent %d ended\n", pid)
		return err
	}
	return c
}

// waitExit waits, bounded by ctx, until process pid has exited, on a pidfd
// (which a recycled pid cannot fool once open).
func waitExit(ctx context.Context, pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer unix.Close(fd)
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 100)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("watch: %w", err)
		}
		if n > 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("still running: %w", ctx.Err())
		}
	}
}

// holderCmd is the process that keeps the cells' systemd scope alive (a
// scope needs one): it does nothing until SIGTERM, SIGINT or SIGKILL.
func holderCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "scope-holder",
		Short:  "hold the cells' systemd scope (started by the agent or prepare-cgroups)",
		Hidden: true,
		Args:   cli.ExactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
			<-c.Context().Done()
			return nil
		},
	}
}
