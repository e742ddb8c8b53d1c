package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/controlapi/adminapi"
	"cellvisor/internal/cli"
	"cellvisor/manifest"
)

// controlURLFlag adds --control-url: the edge-control API as the edge hosts
// reach it, for the enroll command line printed with a token.
func controlURLFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("control-url", "https://127.0.0.1:8443", "the edge-control API's URL as the edge hosts reach it")
}

func (c *app) edgeCreate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create --name N --org O --country CC --continent XX",
		Short: "create an edge; prints its one-time bootstrap token",
		Long: `Create an edge and print its id and one-time bootstrap token, with the enroll command
line to run on the edge host. The token is shown once.`,
		Example: "  cellvisor-control edge create --name fra-1 --org acme --country DE --continent EU \\\n" +
			"    --control-url https://control.example.net:8443",
		Args: cli.ExactArgs(0),
	}
	var r adminapi.EdgeRequest
	f := cmd.Flags()
	f.StringVar(&r.Name, "name", "", "the edge's name")
	f.StringVar(&r.Org, "org", "", "the organization that runs it")
	f.StringVar(&r.Country, "country", "", "ISO 3166-1 alpha-2 country code")
	f.StringVar(&r.Continent, "continent", "", "continent code: AF, AN, AS, EU, NA, OC or SA")
	f.StringVar(&r.MgmtIPv4, "mgmt-ipv4", "", "management IPv4 address (inventory only)")
	f.StringVar(&r.MgmtIPv6, "mgmt-ipv6", "", "management IPv6 address (inventory only)")
	f.IntVar(&r.Slots, "slots", 0, "slots, 1–32; 0 for the default (8)")
	fill := topologyFlags(cmd, &r.EdgeUpdateRequest)
	ttl := tokenTTLFlag(cmd)
	controlURL := controlURLFlag(cmd)
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, _ []string) (adminapi.CreatedEdge, error) {
		fill()
		r.TokenTTL = ttl.String()
		return ac.CreateEdge(ctx, r)
	}, func(w io.Writer, ce adminapi.CreatedEdge, _ time.Time) error {
		fmt.Fprintf(w, "edge %s created (%d slots)\n", ce.Edge.Name, ce.Edge.Slots)
		printToken(w, ce, *controlURL)
		return nil
	})
}

// tokenTTLFlag adds --token-ttl: how long the bootstrap token enrolls.
func tokenTTLFlag(cmd *cobra.Command) *time.Duration {
	return cmd.Flags().Duration("token-ttl", adminapi.DefaultTokenTTL,
		fmt.Sprintf("how long the bootstrap token enrolls, %s to %s", adminapi.MinTokenTTL, adminapi.MaxTokenTTL))
}

// printToken shows an edge's one-time token and how to enroll with it.
func printToken(w io.Writer, ce adminapi.CreatedEdge, controlURL string) {
	fmt.Fprintf(w, "id:    %s\n", ce.Edge.ID)
	fmt.Fprintf(w, "token: %s\n", ce.Token)
	fmt.Fprintf(w, "The token is shown once and never again, and expires at %s; a lost or expired token needs `cellvisor-control edge rotate ID`.\n",
		ce.TokenExpiresAt.Local().Format(time.RFC3339))
	fmt.Fprintln(w, "Enroll the edge host with the CA from `cellvisor-control ca > ca.pem`:")
	fmt.Fprintf(w, "  cellvisor enroll --control %s --token %s --ca-file ca.pem\n", controlURL, ce.Token)
}

func (c *app) edgeList() *cobra.Command {
	return listCmd(c, &cobra.Command{Use: "list", Short: "list the edges", Args: cli.ExactArgs(0)},
		func(ctx context.Context, ac *adminapi.Client, _ []string) ([]adminapi.EdgeView, error) {
			return ac.Edges(ctx)
		}, "NAME\tID\tORG\tCOUNTRY\tCONTINENT\tREGION\tZONE\tSLOTS\tENROLLMENT\tLAST SEEN\tSEQUENCE/ACTIVE", func(e adminapi.EdgeView, now time.Time) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d/%d", e.Name, e.ID, e.Org, e.Country, e.Continent,
				dash(e.Region), dash(e.Zone), e.Slots, e.Enrollment, age(e.LastSeen, now), e.Sequence, e.ActiveSequence)
		})
}

func (c *app) edgeShow() *cobra.Command {
	return oneCmd(c, &cobra.Command{
		Use:   "show ID",
		Short: "show one edge: its status, its cells as last reported, acks and tasks",
		Args:  cli.ExactArgs(1),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.EdgeView, error) {
		return ac.Edge(ctx, args[0])
	}, printEdge)
}

// printEdge is edge show's human-readable form.
func printEdge(w io.Writer, e adminapi.EdgeView, now time.Time) error {
	fmt.Fprintf(w, "edge %s (%s)\n", e.Name, e.ID)
	mgmt := strings.Join(slices.DeleteFunc([]string{e.MgmtIPv4, e.MgmtIPv6}, func(s string) bool { return s == "" }), ", ")
	if mgmt == "" {
		mgmt = "-"
	}
	fmt.Fprintf(w, "  org %s, %s/%s, %d slots, management %s\n", e.Org, e.Country, e.Continent, e.Slots, mgmt)
	fmt.Fprintf(w, "  region %s, zone %s; egress ranking: priority %d, cost tier %d, weight %d\n",
		dash(e.Region), dash(e.Zone), e.Priority, e.CostTier, e.Weight)
	enrolled := e.Enrollment
	if e.EnrolledAt != nil {
		enrolled += " " + age(e.EnrolledAt, now)
	}
	fmt.Fprintf(w, "  enrollment: %s, %d rotation(s), last seen %s\n", enrolled, e.Rotations, age(e.LastSeen, now))
	fmt.Fprintf(w, "  manifests: sequence %d, active (acked) %d\n", e.Sequence, e.ActiveSequence)
	if r := e.Runtime; r != nil {
		fmt.Fprintf(w, "  runtime: %s", cli.Printable(dash(r.Version)))
		if r.Superseded > 0 {
			fmt.Fprintf(w, ", %d cell(s) on a superseded runtime", r.Superseded)
		}
		if r.Upgrade != "" {
			fmt.Fprintf(w, ", upgrade %s", cli.Printable(r.Upgrade))
		}
		if r.Reason != "" {
			fmt.Fprintf(w, ": %s", cli.Printable(r.Reason))
		}
		fmt.Fprintln(w)
	}
	switch {
	case e.EncryptionKeyID != "":
		fmt.Fprintf(w, "  https keys: sealed to encryption key %.16s\n", e.EncryptionKeyID)
	case e.HTTPSKeys != "":
		fmt.Fprintf(w, "  https keys: %s\n", e.HTTPSKeys)
	}
	if len(e.Assignments) > 0 {
		cells := make([]string, 0, len(e.Assignments))
		for cell := range e.Assignments {
			cells = append(cells, cell)
		}
		slices.Sort(cells)
		for i, cell := range cells {
			cells[i] = cell + " " + e.Assignments[cell]
		}
		fmt.Fprintf(w, "  assignments: %s\n", strings.Join(cells, ", "))
	}
	printPoolHealth(w, e.Pools)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(e.Cells) > 0 {
		fmt.Fprintf(tw, "\ncells, as reported %s:\n", age(e.StatusAt, now))
		fmt.Fprintln(tw, "CELL\tPOOL\tSTATE\tDRAINED\tSEQUENCE\tRUNTIME\tREASON")
		for _, cl := range e.Cells {
			rt := dash(cl.RuntimeVersion)
			if cl.RuntimeSuperseded {
				rt += " (superseded)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%d\t%s\t%s\n", cl.Name, dash(cl.Pool), cl.State, cl.Drained, cl.Sequence, cli.Printable(rt), cl.Reason)
		}
	}
	if len(e.SecurityEvents) > 0 {
		fmt.Fprintln(tw, "\nsecurity events:")
		fmt.Fprintln(tw, "CELL\tREFUSED CALLS\tLAST\tREASON")
		for _, s := range e.SecurityEvents {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", s.Cell, s.AuthFailures, age(s.LastAt, now), s.LastReason)
		}
	}
	if len(e.Drains) > 0 {
		fmt.Fprintln(tw, "\ncell drains (domains moved off before a cell is unassigned or reassigned):")
		fmt.Fprintln(tw, "CELL\tFROM\tTO\tSTATE\tDOMAINS\tSTARTED\tWAITING FOR / REASON")
		for _, d := range e.Drains {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.Cell, d.From, dash(d.To), d.State, len(d.Domains), age(&d.StartedAt, now), dash(d.WaitingFor+d.Reason))
		}
	}
	if len(e.Acks) > 0 {
		fmt.Fprintln(tw, "\nacks:")
		fmt.Fprintln(tw, "SEQUENCE\tSTATUS\tAT\tCELLS\tRUNTIMES\tREASON")
		for _, a := range e.Acks {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", a.Sequence, a.Status, age(&a.At, now), dash(strings.Join(a.Cells, ",")), ackRuntimes(a.Runtimes), a.Reason)
		}
	}
	if len(e.Tasks) > 0 {
		fmt.Fprintln(tw, "\ntasks:")
		fmt.Fprintln(tw, "ID\tCELL\tACTION\tSTATE\tRESULT\tCREATED")
		for _, t := range e.Tasks {
			fmt.Fprintln(tw, taskRow(t, now))
		}
	}
	return tw.Flush()
}

// ackRuntimes is an ack's runtimes on one line: "cell-01 nginx/1.22.1
// (superseded), cell-02 nginx/1.22.2".
func ackRuntimes(rs []manifest.CellRuntime) string {
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		p := r.Cell + " " + cmp.Or(r.Version, "unknown")
		if r.Superseded {
			p += " (superseded)"
		}
		parts = append(parts, cli.Printable(p))
	}
	return dash(strings.Join(parts, ", "))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (c *app) edgeDelete() *cobra.Command {
	return oneCmd(c, &cobra.Command{
		Use:   "delete ID",
		Short: "remove a retired edge: its certificate is refused, its manifests, acks and tasks go",
		Args:  cli.ExactArgs(1),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.EdgeView, error) {
		return ac.DeleteEdge(ctx, args[0])
	}, nil)
}

func (c *app) edgeRotate() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rotate ID",
		Short: "refuse the edge's certificate from now on; prints a new token",
		Long: `Rotate an edge's identity: its current certificate is refused from now on, and a new
one-time token is printed for enrolling it again (cellvisor enroll --replace).`,
		Args: cli.ExactArgs(1),
	}
	ttl := tokenTTLFlag(cmd)
	controlURL := controlURLFlag(cmd)
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.CreatedEdge, error) {
		return ac.RotateWith(ctx, args[0], adminapi.RotateRequest{TokenTTL: ttl.String()})
	}, func(w io.Writer, ce adminapi.CreatedEdge, _ time.Time) error {
		fmt.Fprintf(w, "edge %s rotated: its certificate is refused from now on\n", ce.Edge.Name)
		printToken(w, ce, *controlURL)
		return nil
	})
}

func (c *app) taskCreate() *cobra.Command {
	return oneCmd(c, &cobra.Command{
		Use:     "create EDGE-ID CELL drain|undrain|restart",
		Short:   "drain, undrain or restart one cell of an edge; the edge's next poll delivers it",
		Example: "  cellvisor-control task create 6f1c… cell-01 drain",
		Args:    cli.ExactArgs(3),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.TaskView, error) {
		return ac.CreateTask(ctx, args[0], adminapi.TaskRequest{Cell: args[1], Action: args[2]})
	}, func(w io.Writer, t adminapi.TaskView, _ time.Time) error {
		_, err := fmt.Fprintf(w, "task %d created: %s %s of edge %s, %s; delivered by the edge's next poll (cellvisor-control task list %s)\n",
			t.ID, t.Action, t.Cell, t.EdgeID, t.State, t.EdgeID)
		return err
	})
}

func (c *app) taskList() *cobra.Command {
	return listCmd(c, &cobra.Command{Use: "list EDGE-ID", Short: "list an edge's tasks", Args: cli.ExactArgs(1)},
		func(ctx context.Context, ac *adminapi.Client, args []string) ([]adminapi.TaskView, error) {
			return ac.Tasks(ctx, args[0])
		}, "ID\tCELL\tACTION\tSTATE\tRESULT\tCREATED", taskRow)
}

func taskRow(t adminapi.TaskView, now time.Time) string {
	return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s", t.ID, t.Cell, t.Action, t.State, dash(t.Result), age(&t.CreatedAt, now))
}
