package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/controlapi/adminapi"
	"cellvisor/internal/cli"
)

// maxConfig bounds a domain configuration read from a file or stdin; the
// control API refuses far smaller ones.
const maxConfig = 16 << 20

// readConfig reads a domain configuration file, or stdin for "-".
func (c *app) readConfig(path string) (json.RawMessage, error) {
	var r io.Reader = c.in
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("domain configuration: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxConfig+1))
	if err != nil {
		return nil, fmt.Errorf("domain configuration: %w", err)
	}
	if len(data) > maxConfig {
		return nil, fmt.Errorf("domain configuration %s: larger than %d bytes", path, maxConfig)
	}
	// A RawMessage that is not JSON fails to encode with a confusing error.
	if !json.Valid(data) {
		return nil, fmt.Errorf("domain configuration %s: not valid JSON", path)
	}
	return data, nil
}

func (c *app) domainPublish() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "publish NAME --pool P --file F",
		Short: "publish the domain's next revision to a pool",
		Long: `Publish the domain's next revision: F is its JSON configuration (- for stdin). Every edge
with a cell in the pool gets a new signed manifest, delivered by its next poll.`,
		Example: `  cellvisor-control domain publish shop.example.net --pool shared-default --file shop.json
  echo '{"hostnames":["demo.cellvisor.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"hi\n"}}]}' |
    cellvisor-control domain publish demo.cellvisor.test --pool shared-default --file -`,
		Args: cli.ExactArgs(1),
	}
	var r adminapi.DomainRequest
	cmd.Flags().StringVar(&r.Pool, "pool", "", "the pool that serves the domain")
	file := cmd.Flags().String("file", "", "the domain's JSON configuration, - for stdin")
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.PublishedView, error) {
		if *file == "" {
			return adminapi.PublishedView{}, errors.New("--file is required (- for stdin)")
		}
		var err error
		if r.Config, err = c.readConfig(*file); err != nil {
			return adminapi.PublishedView{}, err
		}
		return ac.Publish(ctx, args[0], r)
	}, printPublished("published"))
}

// printPublished is the human-readable outcome of a publish or delete.
func printPublished(verb string) func(io.Writer, adminapi.PublishedView, time.Time) error {
	return func(w io.Writer, p adminapi.PublishedView, _ time.Time) error {
		d := p.Domain
		fmt.Fprintf(w, "%s %s revision %d to %s (%d bytes, sha256 %.12s)\n", verb, d.Name, d.Revision, d.Pool, d.Size, d.SHA256)
		switch {
		case p.EdgesPending > 0:
			fmt.Fprintf(w, "publish %d: %d edge(s) hold the domain; each builds its new manifest at its next poll\n", p.Publish, p.EdgesPending)
		case len(p.Edges) == 0:
			_, err := fmt.Fprintln(w, "no edge has a cell of the domain: no manifest changed")
			return err
		}
		if len(p.Edges) == 0 {
			return nil
		}
		ids := make([]string, 0, len(p.Edges))
		for id := range p.Edges {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		fmt.Fprintf(w, "%d edge manifest(s) advanced, delivered by each edge's next poll:\n", len(ids))
		for _, id := range ids {
			fmt.Fprintf(w, "  %s  sequence %d\n", id, p.Edges[id])
		}
		return nil
	}
}

func (c *app) domainList() *cobra.Command {
	return listCmd(c, &cobra.Command{Use: "list", Short: "list the domains", Args: cli.ExactArgs(0)},
		func(ctx context.Context, ac *adminapi.Client, _ []string) ([]adminapi.DomainView, error) {
			return ac.Domains(ctx)
		}, "NAME\tPOOL\tREVISION\tSIZE\tSHA256\tUPDATED", func(d adminapi.DomainView, now time.Time) string {
			return fmt.Sprintf("%s\t%s\t%d\t%d\t%.12s\t%s", d.Name, d.Pool, d.Revision, d.Size, d.SHA256, age(&d.UpdatedAt, now))
		})
}

func (c *app) domainDelete() *cobra.Command {
	return oneCmd(c, &cobra.Command{
		Use:   "delete NAME",
		Short: "withdraw the domain from every edge",
		Args:  cli.ExactArgs(1),
	}, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.PublishedView, error) {
		return ac.DeleteDomain(ctx, args[0])
	}, nil)
}

func (c *app) domainRollback() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollback NAME --to REVISION",
		Short: "republish an earlier revision of a domain, marked as a rollback",
		Long: `Republish an earlier revision's artifact of a domain, marked as a signed rollback: edges
accept it although its revision is lower than the one they serve (they refuse a lower
revision otherwise). The next ordinary publish gets a revision above every earlier one.`,
		Args: cli.ExactArgs(1),
	}
	to := cmd.Flags().Int64("to", 0, "the earlier revision to republish (required)")
	return oneCmd(c, cmd, func(ctx context.Context, ac *adminapi.Client, args []string) (adminapi.PublishedView, error) {
		if *to < 1 {
			return adminapi.PublishedView{}, errors.New("--to REVISION is required")
		}
		return ac.RollbackDomain(ctx, args[0], *to)
	}, printPublished("rolled back"))
}

func (c *app) keyRotate() *cobra.Command {
	return oneCmd(c, &cobra.Command{
		Use:   "rotate",
		Short: "rotate the control plane's signing key; edges follow it in their next manifest",
		Long: `Rotate the control plane's Ed25519 signing key: the new key is announced in a rotation
signed by the old key and the new one, carried in every manifest header, and every edge's
manifest is signed again with the new key under a new sequence. Edges verify the chain from
the key they pinned and pin the new one; nothing needs re-enrolling.`,
		Args: cli.ExactArgs(0),
	}, func(ctx context.Context, ac *adminapi.Client, _ []string) (adminapi.RotatedView, error) {
		return ac.RotateKey(ctx)
	}, func(w io.Writer, r adminapi.RotatedView, _ time.Time) error {
		_, err := fmt.Fprintf(w, "signing key rotated: %s (was %s); %d edge manifest(s) advanced, delivered by each edge's next poll\n",
			r.PublicKey, r.Previous, len(r.Edges))
		return err
	})
}
