package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"cellvisor/agent"
	"cellvisor/internal/cli"
)

func versionString() string { return "cellvisor " + agent.Version }

func runCmd(cfgPath *string) *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "run the agent (under systemd: Type=notify)",
		Long: `Run the agent in the foreground until SIGINT or SIGTERM: it lays out the slots, starts the
assigned cells in their cgroups, activates their configuration (a local directory, a spool
directory, or the control API it enrolled with) and serves its admin socket. On SIGTERM it
stops every cell gracefully and removes their cgroups.`,
		Example: "  cellvisor run --config /etc/cellvisor/agent.yaml",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := loadConfig(*cfgPath)
			if err != nil {
				return err
			}
			log, err := cli.NewLogger(cfg.Log.Format, cfg.Log.Level)
			if err != nil {
				return err
			}
			defer log.Sync() //nolint:errcheck // stderr sync fails on terminals
			log.Info("starting", zap.String("version", agent.Version), zap.String("config", *cfgPath))
			a, err := agent.New(cfg, log)
			if err != nil {
				log.Error("refusing to start", zap.Error(err))
				return fmt.Errorf("start agent: %w", err)
			}
			if err := a.Run(c.Context()); err != nil {
				log.Error("agent stopped with errors", zap.Error(err))
				return err
			}
			log.Info("agent stopped")
			return nil
		},
	}
}
