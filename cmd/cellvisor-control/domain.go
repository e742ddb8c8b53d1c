package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"cellvisor/controlapi"
)

func (c *cli) poolList(ctx context.Context, args []string) error {
	fs := c.flags("pool list")
	format := outputFlag(fs, "table", "json")
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
	pools, err := ac.Pools(ctx)
	if err != nil {
		return fmt.Errorf("pool list: %w", err)
	}
	if f == "json" {
		return printJSON(c.out, pools)
	}
	now := time.Now()
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCLASS\tCREATED")
	for _, p := range pools {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, p.Class, age(&p.CreatedAt, now))
	}
	return tw.Flush()
}

func (c *cli) poolCreate(ctx context.Context, args []string) error {
	fs := c.flags("pool create")
	pos, ac, err := c.parse(fs, args, "NAME")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	p, err := ac.CreatePool(ctx, pos[0])
	if err != nil {
		return fmt.Errorf("pool create: %w", err)
	}
	fmt.Fprintf(c.out, "pool %s created (class %s)\n", p.Name, p.Class)
	return nil
}

// readConfig reads a domain configuration file, or stdin for "-".
func (c *cli) readConfig(path string) (json.RawMessage, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(c.in)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("domain configuration: %w", err)
	}
	// A RawMessage that is not JSON fails to encode with a confusing error.
	if !json.Valid(data) {
		return nil, fmt.Errorf("domain configuration %s: not valid JSON", path)
	}
	return data, nil
}

func (c *cli) domainPublish(ctx context.Context, args []string) error {
	fs := c.flags("domain publish")
	var r controlapi.DomainRequest
	fs.StringVar(&r.Pool, "pool", "", "the pool that serves the domain")
	file := fs.String("file", "", "the domain's JSON configuration, - for stdin")
	pos, ac, err := c.parse(fs, args, "NAME")
	if err != nil {
		return err
	}
	if *file == "" {
		return errors.New("domain publish: --file is required (- for stdin)")
	}
	if r.Config, err = c.readConfig(*file); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	p, err := ac.Publish(ctx, pos[0], r)
	if err != nil {
		return fmt.Errorf("domain publish %s: %w", pos[0], err)
	}
	return printJSON(c.out, p)
}

func (c *cli) domainList(ctx context.Context, args []string) error {
	fs := c.flags("domain list")
	format := outputFlag(fs, "table", "json")
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
	ds, err := ac.Domains(ctx)
	if err != nil {
		return fmt.Errorf("domain list: %w", err)
	}
	if f == "json" {
		return printJSON(c.out, ds)
	}
	now := time.Now()
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPOOL\tREVISION\tSIZE\tSHA256\tUPDATED")
	for _, d := range ds {
		sum := d.SHA256
		if len(sum) > 12 {
			sum = sum[:12]
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", d.Name, d.Pool, d.Revision, d.Size, sum, age(&d.UpdatedAt, now))
	}
	return tw.Flush()
}

func (c *cli) domainDelete(ctx context.Context, args []string) error {
	fs := c.flags("domain delete")
	pos, ac, err := c.parse(fs, args, "NAME")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	p, err := ac.DeleteDomain(ctx, pos[0])
	if err != nil {
		return fmt.Errorf("domain delete %s: %w", pos[0], err)
	}
	return printJSON(c.out, p)
}
