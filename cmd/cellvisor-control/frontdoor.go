package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/controlapi/adminapi"
	"cellvisor/internal/cli"
)

// frontDoorCmd is `cellvisor-control frontdoor`: an edge's front-door URL
// (see docs/frontdoors.md).
func (c *app) frontDoorCmd() *cobra.Command {
	fd := &cobra.Command{Use: "frontdoor", Short: "set, clear, list and resolve edges' front-door URLs"}
	fd.AddCommand(c.frontDoorSet(), c.frontDoorClear(), c.frontDoorList(), c.frontDoorResolve())
	return fd
}

func (c *app) frontDoorSet() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set EDGE-ID URL",
		Short: "make URL the edge's front door (one URL maps to exactly one edge)",
		Long: `Set an edge's front door: URL is normalized (scheme, case, default port, trailing dot,
IDNA) and stored as its origin, https://host:port. It is refused if another edge holds
it, or if the resolver would refuse it as malformed. An edge has one front door:
setting another moves it.`,
		Example: "  cellvisor-control frontdoor set 3f2c…-… https://shop.example.com",
		Args:    cli.ExactArgs(2),
	}
	service := cmd.Flags().String("service", adminapi.DefaultFrontDoorService, "the edge's gateway service that carries it")
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.FrontDoorView, error) {
		return ac.SetFrontDoor(ctx, args[0], adminapi.FrontDoorRequest{URL: args[1], Service: *service})
	}, func(w io.Writer, v adminapi.FrontDoorView, _ time.Time) error {
		_, err := fmt.Fprintf(w, "front door of edge %s (%s): %s\n", v.EdgeID, v.Service, v.URL)
		return err
	})
}

func (c *app) frontDoorClear() *cobra.Command {
	return c.adminCmd(&cobra.Command{
		Use:   "clear EDGE-ID",
		Short: "remove the edge's front door",
		Args:  cli.ExactArgs(1),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) error {
		if err := ac.ClearFrontDoor(ctx, args[0]); err != nil {
			return err
		}
		_, err := fmt.Fprintf(c.out, "front door of edge %s cleared\n", args[0])
		return err
	})
}

func (c *app) frontDoorList() *cobra.Command {
	cmd := &cobra.Command{Use: "list", Short: "list the front doors, with their gateways' topology and health", Args: cli.ExactArgs(0)}
	org := cmd.Flags().String("org", "", "only this organization's")
	return listCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, _ []string) ([]adminapi.FrontDoorView, error) {
		return ac.FrontDoors(ctx, *org)
	}, "URL\tEDGE\tORG\tSERVICE\tREGION/ZONE/LOCALITY\tHEALTHY\tRTT\tLAST SEEN", func(v adminapi.FrontDoorView, now time.Time) string {
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s/%s/%s\t%t\t%s\t%s", v.URL, v.EdgeID, v.Org, v.Service,
			dash(v.Region), dash(v.Zone), dash(v.Locality), v.Healthy, time.Duration(v.RTTMicros)*time.Microsecond, age(v.LastSeen, now))
	})
}

func (c *app) frontDoorResolve() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "resolve URL",
		Short: "resolve URL to its edge, or say why not (unmapped, ambiguous, corrupt_row, malformed)",
		Long: `Resolve URL as the cells do: the edge whose front door is URL's origin, or a refusal with
its stable reason code, and a non-zero exit status. Never a guess, never a fallback.`,
		Example: "  cellvisor-control frontdoor resolve https://Shop.Example.com./cart",
		Args:    cli.ExactArgs(1),
	}
	org := cmd.Flags().String("org", "", "resolve among this organization's front doors only")
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.ResolveView, error) {
		v, err := ac.Resolve(ctx, args[0], *org)
		var ae *adminapi.Error
		if errors.As(err, &ae) && ae.Reason != "" {
			return v, fmt.Errorf("refused (%s): %s", ae.Reason, ae.Message)
		}
		return v, err
	}, func(w io.Writer, v adminapi.ResolveView, _ time.Time) error {
		_, err := fmt.Fprintf(w, "%s -> edge %s (org %s, front door %s)\n", cli.Printable(v.URL), v.EdgeID, v.Org, v.Canonical)
		return err
	})
}
