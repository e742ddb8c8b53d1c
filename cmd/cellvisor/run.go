package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

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
stops every cell gracefully and removes their cgroups, except under systemd with the cells
in their own scope (cgroup.scope) while systemd restarts the unit: then it leaves them
serving for the next agent, which adopts them. cellvisor shutdown always stops them. On SIGHUP it re-reads the
configuration and applies what can change while cells run (log level, liveness,
restart settings, cell limits); it refuses, with the reason in its log, a file that
changes anything else.`,
		Example: "  cellvisor run --config /etc/cellvisor/agent.yaml",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := loadConfig(*cfgPath)
			if err != nil {
				return err
			}
			level, err := zap.ParseAtomicLevel(cfg.Log.Level)
			if err != nil {
				return fmt.Errorf("log level: %w", err)
			}
			// Built at the lowest level and filtered by level, which SIGHUP
			// changes.
			log, err := cli.NewLogger(cfg.Log.Format, "debug")
			if err != nil {
				return err
			}
			log = log.WithOptions(zap.IncreaseLevel(level))
			defer log.Sync() //nolint:errcheck // stderr sync fails on terminals
			log.Info("starting", zap.String("version", agent.Version), zap.String("config", *cfgPath))
			a, err := agent.New(cfg, log)
			if err != nil {
				log.Error("refusing to start", zap.Error(err))
				return fmt.Errorf("start agent: %w", err)
			}
			// Taken before the agent runs: SIGHUP's default action ends the process.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			ctx, stopHUP := context.WithCancel(c.Context())
			hupDone := make(chan struct{})
			go func() { defer close(hupDone); reloadOnHUP(ctx, hup, *cfgPath, a, level, log) }()
			err = a.Run(ctx)
			stopHUP()
			<-hupDone
			if err != nil {
				log.Error("agent stopped with errors", zap.Error(err))
				return err
			}
			log.Info("agent stopped")
			return nil
		},
	}
}

// reloadOnHUP re-reads the configuration on every signal on hup until ctx ends and
// applies it (agent.Reload), the log level last; a refused one changes
// nothing and the log says why. Each signal also has the cells' runtime
// looked at again, refused reload or not (the packages' dpkg trigger).
func reloadOnHUP(ctx context.Context, hup <-chan os.Signal, path string, a *agent.Agent, level zap.AtomicLevel, log *zap.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		log.Info("SIGHUP: reloading the configuration", zap.String("config", path))
		a.CheckRuntime()
		next, err := loadConfig(path)
		var lvl zapcore.Level
		if err == nil {
			lvl, err = zapcore.ParseLevel(next.Log.Level)
		}
		if err == nil {
			err = a.Reload(ctx, next)
		}
		if err != nil {
			log.Error("configuration reload refused; the running configuration stays", zap.Error(err))
			continue
		}
		level.SetLevel(lvl)
		// Written at the new level, or info if that is lower: always seen.
		log.Log(max(lvl, zapcore.InfoLevel), "configuration reloaded", zap.Stringer("log_level", lvl))
	}
}
