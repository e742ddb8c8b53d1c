package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"cellvisor/controlapi"
)

// controlURLFlag adds --control-url: the edge-control API as the edge hosts
// reach it, for the enroll command line printed with a token.
func controlURLFlag(fs *flag.FlagSet) *string {
	return fs.String("control-url", "https://127.0.0.1:8443", "the edge-control API's URL as the edge hosts reach it")
}

func (c *cli) edgeCreate(ctx context.Context, args []string) error {
	fs := c.flags("edge create")
	var r controlapi.EdgeRequest
	fs.StringVar(&r.Name, "name", "", "the edge's name")
	fs.StringVar(&r.Org, "org", "", "the organization that runs it")
	fs.StringVar(&r.Country, "country", "", "ISO 3166-1 alpha-2 country code")
	fs.StringVar(&r.Continent, "continent", "", "continent code: AF, AN, AS, EU, NA, OC or SA")
	fs.StringVar(&r.MgmtIPv4, "mgmt-ipv4", "", "management IPv4 address (inventory only)")
	fs.StringVar(&r.MgmtIPv6, "mgmt-ipv6", "", "management IPv6 address (inventory only)")
	fs.IntVar(&r.Slots, "slots", 0, "slots, 1–32; 0 for the default (8)")
	ttl := tokenTTLFlag(fs)
	controlURL := controlURLFlag(fs)
	format := outputFlag(fs, "text", "json")
	_, ac, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	f, err := format()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	r.TokenTTL = ttl.String()
	ce, err := ac.CreateEdge(ctx, r)
	if err != nil {
		return fmt.Errorf("edge create: %w", err)
	}
	if f == "json" {
		return printJSON(c.out, ce)
	}
	fmt.Fprintf(c.out, "edge %s created (%d slots)\n", ce.Edge.Name, ce.Edge.Slots)
	printToken(c.out, ce, *controlURL)
	return nil
}

// tokenTTLFlag adds --token-ttl: how long the bootstrap token enrolls.
func tokenTTLFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("token-ttl", controlapi.DefaultTokenTTL, fmt.Sprintf("how long the bootstrap token enrolls, %s to %s", controlapi.MinTokenTTL, controlapi.MaxTokenTTL))
}

// printToken shows an edge's one-time token and how to enroll with it.
func printToken(w io.Writer, ce controlapi.CreatedEdge, controlURL string) {
	fmt.Fprintf(w, "id:    %s\n", ce.Edge.ID)
	fmt.Fprintf(w, "token: %s\n", ce.Token)
	fmt.Fprintf(w, "The token is shown once and never again, and expires at %s; a lost or expired token needs `cellvisor-control edge rotate ID`.\n",
		ce.TokenExpiresAt.Local().Format(time.RFC3339))
	fmt.Fprintln(w, "Enroll the edge host with the CA from `cellvisor-control ca > ca.pem`:")
	fmt.Fprintf(w, "  cellvisor enroll --control %s --token %s --ca-file ca.pem\n", controlURL, ce.Token)
}

func (c *cli) edgeList(ctx context.Context, args []string) error {
	return list(ctx, c, "edge list", args, nil, func(ctx context.Context, ac *controlapi.AdminClient, _ []string) ([]controlapi.EdgeView, error) {
		return ac.Edges(ctx)
	}, "NAME\tID\tORG\tCOUNTRY\tCONTINENT\tSLOTS\tENROLLMENT\tLAST SEEN\tSEQUENCE/ACTIVE", func(e controlapi.EdgeView, now time.Time) string {
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d/%d", e.Name, e.ID, e.Org, e.Country, e.Continent,
			e.Slots, e.Enrollment, age(e.LastSeen, now), e.Sequence, e.ActiveSequence)
	})
}

func (c *cli) edgeShow(ctx context.Context, args []string) error {
	return one(ctx, c, "edge show", args, []string{"ID"}, func(ctx context.Context, ac *controlapi.AdminClient, pos []string) (controlapi.EdgeView, error) {
		return ac.Edge(ctx, pos[0])
	})
}

func (c *cli) edgeDelete(ctx context.Context, args []string) error {
	return one(ctx, c, "edge delete", args, []string{"ID"}, func(ctx context.Context, ac *controlapi.AdminClient, pos []string) (controlapi.EdgeView, error) {
		return ac.DeleteEdge(ctx, pos[0])
	})
}

func (c *cli) edgeRotate(ctx context.Context, args []string) error {
	fs := c.flags("edge rotate")
	ttl := tokenTTLFlag(fs)
	controlURL := controlURLFlag(fs)
	format := outputFlag(fs, "text", "json")
	pos, ac, err := c.parse(fs, args, "ID")
	if err != nil {
		return err
	}
	f, err := format()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	ce, err := ac.RotateWith(ctx, pos[0], controlapi.RotateRequest{TokenTTL: ttl.String()})
	if err != nil {
		return fmt.Errorf("edge rotate %s: %w", pos[0], err)
	}
	if f == "json" {
		return printJSON(c.out, ce)
	}
	fmt.Fprintf(c.out, "edge %s rotated: its certificate is refused from now on\n", ce.Edge.Name)
	printToken(c.out, ce, *controlURL)
	return nil
}

func (c *cli) taskCreate(ctx context.Context, args []string) error {
	return one(ctx, c, "task create", args, []string{"EDGE-ID", "CELL", "drain|undrain|restart"},
		func(ctx context.Context, ac *controlapi.AdminClient, pos []string) (controlapi.TaskView, error) {
			return ac.CreateTask(ctx, pos[0], controlapi.TaskRequest{Cell: pos[1], Action: pos[2]})
		})
}

func (c *cli) taskList(ctx context.Context, args []string) error {
	return list(ctx, c, "task list", args, []string{"EDGE-ID"}, func(ctx context.Context, ac *controlapi.AdminClient, pos []string) ([]controlapi.TaskView, error) {
		return ac.Tasks(ctx, pos[0])
	}, "ID\tCELL\tACTION\tSTATE\tRESULT\tCREATED", func(t controlapi.TaskView, now time.Time) string {
		result := t.Result
		if result == "" {
			result = "-"
		}
		return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s", t.ID, t.Cell, t.Action, t.State, result, age(&t.CreatedAt, now))
	})
}
