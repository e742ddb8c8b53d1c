package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/controlapi/adminapi"
	"cellvisor/internal/cli"
)

func (c *app) poolList() *cobra.Command {
	return listCmd(c, &cobra.Command{Use: "list", Short: "list the pools", Args: cli.ExactArgs(0)},
		func(ctx context.Context, ac *adminapi.Client, _ []string) ([]adminapi.PoolView, error) {
			return ac.Pools(ctx)
		}, "NAME\tCLASS\tREPLICAS\tBOUND\tMIN READY\tDRAIN\tMAX CONNS\tRATE/BURST\tCREATED", func(p adminapi.PoolView, now time.Time) string {
			return fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%s\t%d\t%d/%d\t%s", p.Name, p.Class, p.Replicas, p.Bound, p.MinReady, p.Drain,
				p.MaxConns, p.Rate, p.Burst, age(&p.CreatedAt, now))
		})
}

// poolFlags adds the settings of a pool; only the flags given are sent.
func poolFlags(cmd *cobra.Command, withReplicas bool) func(*adminapi.PoolRequest) {
	f := cmd.Flags()
	replicas := f.Int("replicas", 1, "distinct cells per edge for each domain: 1 for shared and quarantine, 1–3 for reserved and dedicated")
	if !withReplicas {
		f.MarkHidden("replicas")
	}
	bound := f.Int("bound", 0, "the most domains one cell holds; 0 for none")
	minReady := f.Int("min-ready", 0, "the fewest ready cells on an edge for new placements there")
	drain := f.Duration("drain", 0, "how long a domain moving out keeps being served by the pool's cells")
	maxConns := f.Int("max-conns", 0, "each cell's limit of concurrent connections (503 past it); 0 for none")
	rate := f.Int("rate", 0, "each cell's request rate per client address, per second (429 past it); 0 for none")
	burst := f.Int("burst", 0, "requests allowed above the rate in a burst")
	return func(r *adminapi.PoolRequest) {
		set := func(name string, v *int, dst **int) {
			if f.Changed(name) {
				*dst = v
			}
		}
		if withReplicas {
			set("replicas", replicas, &r.Replicas)
		}
		set("bound", bound, &r.Bound)
		set("min-ready", minReady, &r.MinReady)
		set("max-conns", maxConns, &r.MaxConns)
		set("rate", rate, &r.Rate)
		set("burst", burst, &r.Burst)
		if f.Changed("drain") {
			d := drain.String()
			r.Drain = &d
		}
	}
}

func (c *app) poolCreate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create NAME [--replicas N] [--bound N] [--min-ready N] [--drain D] [--max-conns N] [--rate N --burst N]",
		Short: "create a pool: NAME is shared-, reserved-, dedicated- or quarantine- and a name",
		Long: `Create a pool. Settings not given take the class's defaults (see docs/placement.md).
A pool serves domains on an edge only once cells are assigned to it (cell assign).`,
		Example: "  cellvisor-control pool create reserved-eu --replicas 2 --bound 200 --drain 2m",
		Args:    cli.ExactArgs(1),
	}
	fill := poolFlags(cmd, true)
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.PoolView, error) {
		r := adminapi.PoolRequest{Name: args[0]}
		fill(&r)
		return ac.CreatePoolWith(ctx, r)
	}, func(w io.Writer, p adminapi.PoolView, now time.Time) error {
		fmt.Fprintf(w, "pool %s created (class %s)\n", p.Name, p.Class)
		return printPool(w, p, now)
	})
}

func (c *app) poolUpdate() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "update NAME [--bound N] [--min-ready N] [--drain D] [--max-conns N] [--rate N --burst N]",
		Short:   "change a pool's bound, minimum, drain interval or cell limits (new limits reach its edges signed)",
		Example: "  cellvisor-control pool update shared-default --max-conns 8192",
		Args:    cli.ExactArgs(1),
	}
	fill := poolFlags(cmd, false)
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.PoolView, error) {
		var r adminapi.PoolRequest
		fill(&r)
		return ac.UpdatePool(ctx, args[0], r)
	}, func(w io.Writer, p adminapi.PoolView, now time.Time) error {
		fmt.Fprintf(w, "pool %s updated; %d edge manifest(s) advanced\n", p.Name, len(p.Sequences))
		return printPool(w, p, now)
	})
}

func (c *app) poolShow() *cobra.Command {
	return oneCmd(c, &cobra.Command{
		Use:   "show NAME",
		Short: "show a pool, its cells on every edge and whether enough of them are ready",
		Args:  cli.ExactArgs(1),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.PoolView, error) {
		return ac.Pool(ctx, args[0])
	}, printPool)
}

func (c *app) poolDelete() *cobra.Command {
	return c.adminCmd(&cobra.Command{
		Use:   "delete NAME",
		Short: "delete a pool that has no domains and no cells",
		Args:  cli.ExactArgs(1),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) error {
		if err := ac.DeletePool(ctx, args[0]); err != nil {
			return err
		}
		_, err := fmt.Fprintf(c.out, "pool %s deleted\n", args[0])
		return err
	})
}

func printPool(w io.Writer, p adminapi.PoolView, _ time.Time) error {
	fmt.Fprintf(w, "pool %s: class %s, %d replica(s) per edge, bound %d domains per cell, minimum %d ready cell(s), drain %s\n",
		p.Name, p.Class, p.Replicas, p.Bound, p.MinReady, p.Drain)
	fmt.Fprintf(w, "  each cell: %d connections, %d requests/s per client (burst %d)\n", p.MaxConns, p.Rate, p.Burst)
	printPoolHealth(w, p.Edges)
	return nil
}

// printPoolHealth lists pools' cells on edges, flagging those below their
// minimum of ready cells.
func printPoolHealth(w io.Writer, hs []adminapi.PoolHealth) {
	if len(hs) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tEDGE\tCELLS\tREADY\tMINIMUM\tSTATE")
	for _, h := range hs {
		ready, state := fmt.Sprint(h.Ready), "ok"
		switch {
		case !h.Reported:
			ready, state = "-", "not reported"
		case h.BelowMinimum:
			state = "BELOW MINIMUM: " + h.Reason
		}
		edge := h.EdgeName
		if edge == "" {
			edge = h.EdgeID
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", h.Pool, edge, strings.Join(h.Cells, ","), ready, h.MinReady, state)
	}
	tw.Flush()
}

func (c *app) cellAssign() *cobra.Command {
	return oneCmd(c, &cobra.Command{
		Use:     "assign EDGE CELL POOL",
		Short:   "assign an edge's cell to a pool (EDGE is its id or name); the edge applies it from its next signed manifest",
		Example: "  cellvisor-control cell assign fra-1 cell-03 reserved-eu",
		Args:    cli.ExactArgs(3),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.CellAssignment, error) {
		return ac.AssignCell(ctx, args[0], args[1], args[2])
	}, func(w io.Writer, a adminapi.CellAssignment, _ time.Time) error {
		if a.Drain != nil {
			return printDrain(w, a)
		}
		_, err := fmt.Fprintf(w, "%s of edge %s assigned to %s (manifest sequence %d)\n", a.Cell, a.EdgeID, a.Pool, a.Sequence)
		return err
	})
}

func (c *app) cellUnassign() *cobra.Command {
	return oneCmd(c, &cobra.Command{
		Use:     "unassign EDGE CELL",
		Short:   "unassign an edge's cell: the edge drains and stops it",
		Example: "  cellvisor-control cell unassign fra-1 cell-03",
		Args:    cli.ExactArgs(2),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.CellAssignment, error) {
		return ac.AssignCell(ctx, args[0], args[1], "")
	}, func(w io.Writer, a adminapi.CellAssignment, _ time.Time) error {
		if a.Drain != nil {
			return printDrain(w, a)
		}
		_, err := fmt.Fprintf(w, "%s of edge %s unassigned (manifest sequence %d)\n", a.Cell, a.EdgeID, a.Sequence)
		return err
	})
}

// printDrain says that a cell holding domains drains before it changes.
func printDrain(w io.Writer, a adminapi.CellAssignment) error {
	change := "unassigned"
	if a.Pool != "" {
		change = "assigned to " + a.Pool
	}
	if _, err := fmt.Fprintf(w, "%s of edge %s holds %d domain(s) of %s: they move to the pool's other cells first (manifest sequence %d); the cell is %s once they serve there (edge show %s)\n",
		a.Cell, a.EdgeID, len(a.Drain.Domains), a.Drain.From, a.Sequence, change, a.EdgeID); err != nil {
		return err
	}
	for _, st := range a.Drain.Steps {
		if _, err := fmt.Fprintf(w, "  %s  %s  %s\n", st.At.Format(time.RFC3339), st.Step, st.Detail); err != nil {
			return err
		}
	}
	return nil
}

func (c *app) domainShow() *cobra.Command {
	return oneCmd(c, &cobra.Command{
		Use:   "show NAME",
		Short: "show a domain: its revision, its cells on every edge and its latest move, step by step",
		Args:  cli.ExactArgs(1),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.DomainView, error) {
		return ac.Domain(ctx, args[0])
	}, printDomain)
}

// printDomain is domain show's human-readable output: the domain, its
// cells with the revision each serves, and its latest move.
func printDomain(w io.Writer, d adminapi.DomainView, now time.Time) error {
	fmt.Fprintf(w, "domain %s: pool %s, revision %d (%d bytes, sha256 %s), updated %s\n", d.Name, d.Pool, d.Revision, d.Size, d.SHA256, age(&d.UpdatedAt, now))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	switch {
	case len(d.Cells) > 0:
		fmt.Fprintln(tw, "EDGE\tCELL\tPOOL\tROLE\tSTATE\tREVISION\tCURRENT")
		for _, c := range d.Cells {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cmp.Or(c.EdgeName, c.EdgeID), c.Cell, c.Pool, c.Role,
				cli.Printable(cmp.Or(c.State, "unreported")), servedRevision(c.Revision), yesNo(c.Current))
		}
	case len(d.Placements) > 0: // a control API from before cells
		fmt.Fprintln(tw, "EDGE\tCELL\tPOOL\tROLE")
		for _, p := range d.Placements {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.EdgeID, p.Cell, p.Pool, p.Role)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if d.Move != nil {
		printMove(w, *d.Move)
	}
	return nil
}

// servedRevision is a cell's applied revision, "none" for 0.
func servedRevision(rev int64) string {
	if rev == 0 {
		return "none"
	}
	return strconv.FormatInt(rev, 10)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func printMove(w io.Writer, m adminapi.MoveView) {
	fmt.Fprintf(w, "move %s → %s: %s", m.From, m.To, m.State)
	if m.Reason != "" {
		fmt.Fprintf(w, " (%s)", m.Reason)
	}
	fmt.Fprintln(w)
	for _, st := range m.Steps {
		fmt.Fprintf(w, "  %s  %-10s %s\n", st.At.Local().Format(time.RFC3339), st.Step, st.Detail)
	}
}

func (c *app) domainMove() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "move NAME --to POOL | --cancel",
		Short: "move a domain to another pool, target-first, or cancel a move that has not switched",
		Long: `Move a domain to another pool: its current revision goes to the target cells first; once
every one applied it and reports ready, routing switches to them, the source cells keep
serving for the source pool's drain interval, then let it go. domain show follows the steps.`,
		Example: "  cellvisor-control domain move shop.example --to reserved-eu\n  cellvisor-control domain move shop.example --cancel",
		Args:    cli.ExactArgs(1),
	}
	to := cmd.Flags().String("to", "", "the target pool")
	cancel := cmd.Flags().Bool("cancel", false, "cancel the move under way (before it switched)")
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.MoveView, error) {
		switch {
		case *cancel && *to != "":
			return adminapi.MoveView{}, errors.New("--to and --cancel: give one")
		case *cancel:
			return ac.CancelMove(ctx, args[0])
		case *to == "":
			return adminapi.MoveView{}, errors.New("--to POOL or --cancel required")
		}
		return ac.Move(ctx, args[0], *to)
	}, func(w io.Writer, m adminapi.MoveView, _ time.Time) error {
		printMove(w, m)
		return nil
	})
}

func (c *app) domainRouting() *cobra.Command {
	return listCmd(c, &cobra.Command{
		Use:   "routing NAME",
		Short: "what DNS would publish for a domain: its active cells' addresses and ports",
		Long: `What DNS would publish for a domain: its active cells that their edge reported ready and
that serve its current revision, with their addresses and ports. While none serves the
current revision yet (a publish on its way), the ready active cells that serve an earlier
one; never a cell that serves no revision of the domain.`,
		Args: cli.ExactArgs(1),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) ([]adminapi.Route, error) {
		v, err := ac.Routing(ctx, args[0])
		return v.Routes, err
	}, "EDGE\tCELL\tADDRESS\tREVISION", func(r adminapi.Route, _ time.Time) string {
		return fmt.Sprintf("%s\t%s\t%s\t%d", r.EdgeName, r.Cell, r.HostPort(), r.Revision)
	})
}
