package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"cellvisor/controlapi"
)

func (c *cli) poolList(ctx context.Context, args []string) error {
	return list(ctx, c, "pool list", args, nil, func(ctx context.Context, ac *controlapi.AdminClient, _ []string) ([]controlapi.PoolView, error) {
		return ac.Pools(ctx)
	}, "NAME\tCLASS\tCREATED", func(p controlapi.PoolView, now time.Time) string {
		return fmt.Sprintf("%s\t%s\t%s", p.Name, p.Class, age(&p.CreatedAt, now))
	})
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
	return list(ctx, c, "domain list", args, nil, func(ctx context.Context, ac *controlapi.AdminClient, _ []string) ([]controlapi.DomainView, error) {
		return ac.Domains(ctx)
	}, "NAME\tPOOL\tREVISION\tSIZE\tSHA256\tUPDATED", func(d controlapi.DomainView, now time.Time) string {
		return fmt.Sprintf("%s\t%s\t%d\t%d\t%.12s\t%s", d.Name, d.Pool, d.Revision, d.Size, d.SHA256, age(&d.UpdatedAt, now))
	})
}

func (c *cli) domainDelete(ctx context.Context, args []string) error {
	return one(ctx, c, "domain delete", args, []string{"NAME"}, func(ctx context.Context, ac *controlapi.AdminClient, pos []string) (controlapi.PublishedView, error) {
		return ac.DeleteDomain(ctx, pos[0])
	})
}

func (c *cli) domainRollback(ctx context.Context, args []string) error {
	fs := c.flags("domain rollback")
	to := fs.Int64("to", 0, "the earlier revision to republish")
	pos, ac, err := c.parse(fs, args, "NAME")
	if err != nil {
		return err
	}
	if *to < 1 {
		return errors.New("domain rollback: --to REVISION is required")
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	p, err := ac.RollbackDomain(ctx, pos[0], *to)
	if err != nil {
		return fmt.Errorf("domain rollback %s: %w", pos[0], err)
	}
	return printJSON(c.out, p)
}

func (c *cli) keyRotate(ctx context.Context, args []string) error {
	return one(ctx, c, "key rotate", args, nil, func(ctx context.Context, ac *controlapi.AdminClient, _ []string) (controlapi.RotatedView, error) {
		return ac.RotateKey(ctx)
	})
}
