// Command cellvisor is the edge-host agent and its operator CLI. It links no
// control-plane code and no database driver (internal/deptest keeps that
// true): the demo, which embeds a control API, is cmd/cellvisor-demo.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"cellvisor/config"
	"cellvisor/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "cellvisor:", cli.Printable(err.Error()))
		os.Exit(1)
	}
}

// run runs one command line.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return cli.Execute(ctx, newRoot(stdout), args, stdout, stderr)
}

// newRoot builds the command tree; commands print to stdout.
func newRoot(stdout io.Writer) *cobra.Command {
	var cfgPath string
	root := &cobra.Command{
		Use:   "cellvisor",
		Short: "the cellvisor edge-host agent and its operator CLI",
		Long: `cellvisor runs the edge-host agent (cellvisor run, under systemd) and talks to a
running agent through its admin socket (status, drain, undrain, restart).

The flag --config may stand before or after the command.`,
		Example: `  cellvisor run --config /etc/cellvisor/agent.yaml
  cellvisor status -o json
  cellvisor drain cell-01 --config .demo/agent.yaml`,
		Version: versionString(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.PersistentFlags().StringVar(&cfgPath, "config", config.DefaultPath, "the agent's configuration file")
	load := func() (config.Agent, error) { return loadConfig(cfgPath) }
	root.AddCommand(
		runCmd(&cfgPath),
		enrollCmd(load, stdout),
		prepareCmd(stdout),
		shutdownCmd(load, stdout),
		holderCmd(),
		statusCmd(load, stdout),
		controlCmd("drain", "stop advertising readiness; requests in flight complete",
			"The cell's readiness check (/.cellvisor/ready) answers 503 until undrain; the cell keeps serving requests.", load, stdout),
		controlCmd("undrain", "advertise readiness again", "", load, stdout),
		upgradeRuntimeCmd(load, stdout),
		controlCmd("restart", "restart the cell gracefully: drain, wait for requests in flight, stop, start",
			"Operator restarts are rate-limited per cell (restart.rate_limit in restart.rate_window, 3 in 10 minutes by default);\na refused restart says when the next is allowed.", load, stdout),
		&cobra.Command{
			Use:   "version",
			Short: "print the version",
			Args:  cobra.NoArgs,
			RunE: func(*cobra.Command, []string) error {
				_, err := fmt.Fprintln(stdout, versionString())
				return err
			},
		},
	)
	return root
}

// loadConfig loads the agent's configuration; a missing file names the
// path tried and the flag that changes it.
func loadConfig(path string) (config.Agent, error) {
	cfg, err := config.Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, fmt.Errorf("no configuration file at %s: pass --config FILE (before or after the command)", path)
	}
	return cfg, err
}
