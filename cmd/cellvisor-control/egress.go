package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/controlapi/adminapi"
	"cellvisor/egress"
	"cellvisor/internal/cli"
)

// topologyFlags adds --region, --zone, --priority, --cost-tier and
// --weight to cmd; the request carries only the flags given.
func topologyFlags(cmd *cobra.Command, u *adminapi.EdgeUpdateRequest) func() {
	f := cmd.Flags()
	region := f.String("region", "", "the edge's region (egress prefers a class's region)")
	zone := f.String("zone", "", "the edge's availability zone")
	priority := f.Int("priority", 100, "egress ranking: lower is preferred, 0–65535")
	costTier := f.Int("cost-tier", 0, "egress ranking: lower is preferred, 0–65535")
	weight := f.Int("weight", 100, "egress ranking: higher is preferred, 0–65535")
	return func() {
		set := func(name string) bool { return f.Changed(name) }
		if set("region") {
			u.Region = region
		}
		if set("zone") {
			u.Zone = zone
		}
		if set("priority") {
			u.Priority = priority
		}
		if set("cost-tier") {
			u.CostTier = costTier
		}
		if set("weight") {
			u.Weight = weight
		}
	}
}

func (c *app) edgeUpdate() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "update ID [--region R] [--zone Z] [--priority N] [--cost-tier N] [--weight N]",
		Short:   "set an edge's region, zone and egress ranking",
		Example: "  cellvisor-control edge update 6f1c… --region eu-central --zone eu-central-1a --priority 10",
		Args:    cli.ExactArgs(1),
	}
	var u adminapi.EdgeUpdateRequest
	fill := topologyFlags(cmd, &u)
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.EdgeView, error) {
		fill()
		return ac.UpdateEdge(ctx, args[0], u)
	}, func(w io.Writer, e adminapi.EdgeView, _ time.Time) error {
		_, err := fmt.Fprintf(w, "edge %s: region %s, zone %s, priority %d, cost tier %d, weight %d\n",
			e.Name, dash(e.Region), dash(e.Zone), e.Priority, e.CostTier, e.Weight)
		return err
	})
}

func (c *app) egressCmd() *cobra.Command {
	eg := &cobra.Command{Use: "egress", Short: "governed egress: policies per (org, class) and who holds each lease"}
	policy := &cobra.Command{Use: "policy", Short: "set, show, list and clear egress policies"}
	policy.AddCommand(c.policySet(), c.policyShow(), c.policyList(), c.policyClear())
	eg.AddCommand(policy, c.egressLeases())
	return eg
}

func classesHelp() string {
	s := ""
	for i, cl := range egress.Classes {
		if i > 0 {
			s += ", "
		}
		s += string(cl)
	}
	return s
}

func (c *app) policySet() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set ORG CLASS --destination URL [--region R] [--require-region R] [--require-zone Z]",
		Short: "set an org's egress policy for a traffic class",
		Long: `Set where a traffic class of an org goes (--destination) and where its owner should be:
--region is preferred (its edges rank first), --require-region and --require-zone are
hard requirements (no live edge meeting them: the election refuses). Classes: ` + classesHelp() + ".",
		Example: "  cellvisor-control egress policy set acme metering --destination https://ingest.example.net/metering --region eu-central",
		Args:    cli.ExactArgs(2),
	}
	var r adminapi.EgressPolicyRequest
	f := cmd.Flags()
	f.StringVar(&r.Destination, "destination", "", "the class's destination URL")
	f.StringVar(&r.Region, "region", "", "the preferred region of the owner")
	f.StringVar(&r.Require.Region, "require-region", "", "hard requirement: the owner's region")
	f.StringVar(&r.Require.Zone, "require-zone", "", "hard requirement: the owner's zone")
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.EgressPolicyView, error) {
		return ac.SetEgressPolicy(ctx, args[0], args[1], r)
	}, printPolicy)
}

func printPolicy(w io.Writer, p adminapi.EgressPolicyView, _ time.Time) error {
	_, err := fmt.Fprintf(w, "egress policy %s/%s: destination %s, preferred region %s, required region %s, required zone %s\n",
		p.Org, p.Class, p.Destination, dash(p.Region), dash(p.Require.Region), dash(p.Require.Zone))
	return err
}

func (c *app) policyShow() *cobra.Command {
	return oneCmd(c, &cobra.Command{Use: "show ORG CLASS", Short: "show an org's egress policy for a class", Args: cli.ExactArgs(2)},
		func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.EgressPolicyView, error) {
			return ac.EgressPolicy(ctx, args[0], args[1])
		}, printPolicy)
}

func (c *app) policyClear() *cobra.Command {
	return oneCmd(c, &cobra.Command{Use: "clear ORG CLASS", Short: "remove an org's egress policy for a class (its elections refuse until set)",
		Args: cli.ExactArgs(2)},
		func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.EgressPolicyView, error) {
			return ac.ClearEgressPolicy(ctx, args[0], args[1])
		}, func(w io.Writer, p adminapi.EgressPolicyView, _ time.Time) error {
			_, err := fmt.Fprintf(w, "egress policy %s/%s cleared (was: destination %s)\n", p.Org, p.Class, p.Destination)
			return err
		})
}

func (c *app) policyList() *cobra.Command {
	cmd := &cobra.Command{Use: "list [--org O]", Short: "list egress policies", Args: cli.ExactArgs(0)}
	org := cmd.Flags().String("org", "", "only this org's")
	return listCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, _ []string) ([]adminapi.EgressPolicyView, error) {
		return ac.EgressPolicies(ctx, *org)
	}, "ORG\tCLASS\tDESTINATION\tREGION\tREQUIRE REGION\tREQUIRE ZONE", func(p adminapi.EgressPolicyView, _ time.Time) string {
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", p.Org, p.Class, p.Destination, dash(p.Region), dash(p.Require.Region), dash(p.Require.Zone))
	})
}

func (c *app) egressLeases() *cobra.Command {
	cmd := &cobra.Command{Use: "leases [--org O]", Short: "list who holds each (org, class) egress lease", Args: cli.ExactArgs(0)}
	org := cmd.Flags().String("org", "", "only this org's")
	return listCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, _ []string) ([]adminapi.LeaseView, error) {
		return ac.Leases(ctx, *org)
	}, "ORG\tCLASS\tHOLDER\tNAME\tREGION\tEPOCH\tEXPIRES", func(l adminapi.LeaseView, now time.Time) string {
		exp := "in " + l.ExpiresAt.Sub(now).Round(time.Second).String()
		if l.Expired {
			exp = "expired " + age(&l.ExpiresAt, now)
		}
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d\t%s", l.Org, l.Class, l.Holder, dash(l.HolderName), dash(l.Region), l.Epoch, exp)
	})
}
