package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/config"
	"cellvisor/internal/cli"
	"cellvisor/supervisor"
)

func upgradeRuntimeCmd(load func() (config.Agent, error), stdout io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "upgrade-runtime",
		Short: "roll the cells onto the OpenResty binary now installed",
		Long: `Ask the running agent to move every cell that runs a superseded binary (its file replaced by a
package upgrade) onto the binary now at openresty.binary, one cell at a time, once the binary has
passed -t with every cell's configuration: what runtime_upgrade: auto does by itself, and the way
to do it under runtime_upgrade: manual. Under runtime_upgrade: paced it rolls the remaining cells
without waiting runtime_upgrade_pace between them. The command returns once the roll has started;
cellvisor status follows it. With --dry-run the agent only says what it would do, the check
included.`,
		Example: "  cellvisor upgrade-runtime --dry-run\n  cellvisor upgrade-runtime",
		Args:    cobra.NoArgs,
	}
	dry := c.Flags().Bool("dry-run", false, "say what would happen, change nothing")
	format := cli.Output(c, "text", "json")
	c.RunE = func(c *cobra.Command, _ []string) error {
		f, err := format()
		if err != nil {
			return err
		}
		cfg, err := load()
		if err != nil {
			return err
		}
		// The check runs -t once per cell.
		ctx, cancel := context.WithTimeout(c.Context(), time.Duration(cfg.Slots)*30*time.Second+10*time.Second)
		defer cancel()
		plan, err := adminsock.NewClient(agent.AdminSocket(cfg)).UpgradeRuntime(ctx, *dry)
		if err != nil {
			return fmt.Errorf("upgrade-runtime: %w", err)
		}
		if f == "json" {
			err = printJSON(stdout, plan)
		} else {
			printPlan(stdout, plan)
		}
		if err == nil && plan.Error != "" {
			err = errors.New("upgrade-runtime: the binary was refused; no cell changed")
		}
		return err
	}
	return c
}

// printPlan prints what a roll does or would do.
func printPlan(w io.Writer, p supervisor.UpgradePlan) {
	fmt.Fprintf(w, "runtime: %s %s (runtime_upgrade: %s)\n", cli.Printable(p.Binary), cli.Printable(orUnknown(p.Version)), p.Policy)
	if p.Verified {
		fmt.Fprintln(w, "check: every assigned cell's configuration passes -t")
	} else {
		fmt.Fprintf(w, "check: refused: %s\n", cli.Printable(p.Error))
	}
	if len(p.Cells) == 0 {
		fmt.Fprintln(w, "every running cell runs the binary now installed: nothing to roll")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CELL\tPOOL\tPID\tRUNS\tHOW")
	for _, c := range p.Cells {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", c.Name, c.Pool, c.PID, cli.Printable(orUnknown(c.Version)), c.How)
	}
	tw.Flush()
	switch {
	case !p.Verified:
		fmt.Fprintln(w, "no cell would be touched: every cell keeps the binary it runs")
	case p.DryRun:
		fmt.Fprintf(w, "dry run: nothing changed; the roll would take these %d cell(s) one at a time, each once the others of its pool are ready%s\n", len(p.Cells), notPaced(p.Policy))
	case p.Started:
		fmt.Fprintln(w, "the roll has started: cellvisor status follows it")
	}
}

// notPaced notes, under the paced policy, that the operator's roll does not
// wait the pace.
func notPaced(p supervisor.UpgradePolicy) string {
	if p == supervisor.UpgradePaced {
		return " (without runtime_upgrade_pace: the operator's roll)"
	}
	return ""
}
