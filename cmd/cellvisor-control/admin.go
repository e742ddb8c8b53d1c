package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"cellvisor/controlapi"
)

// adminTimeout bounds one admin API call. Publishing re-signs the manifest
// of every edge in the pool, so it is generous.
const adminTimeout = 2 * time.Minute

// globals are the flags every admin command takes, before or after its
// words.
type globals struct {
	admin     string
	tokenFile string
	caFile    string
}

func defaultGlobals() globals {
	admin := os.Getenv("CELLVISOR_CONTROL_ADMIN")
	if admin == "" {
		admin = "http://127.0.0.1:8442"
	}
	return globals{admin: admin, tokenFile: filepath.Join(defaultData, "admin.token")}
}

// register adds the global flags to fs, their defaults the values so far.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.admin, "admin", g.admin, "the admin API's URL (default $CELLVISOR_CONTROL_ADMIN, else http://127.0.0.1:8442)")
	fs.StringVar(&g.tokenFile, "token-file", g.tokenFile, "the admin token file; $CELLVISOR_ADMIN_TOKEN, when set, is used instead")
	fs.StringVar(&g.caFile, "admin-ca-file", g.caFile, "the CA certificate (PEM) to trust when the admin API is https")
}

// token is $CELLVISOR_ADMIN_TOKEN, or else the token file's content.
func (g *globals) token() (string, error) {
	if t := os.Getenv("CELLVISOR_ADMIN_TOKEN"); t != "" {
		return t, nil
	}
	data, err := os.ReadFile(g.tokenFile)
	if err != nil {
		return "", fmt.Errorf("admin token: %w (set CELLVISOR_ADMIN_TOKEN or pass --token-file)", err)
	}
	t := strings.TrimSpace(string(data))
	if t == "" {
		return "", fmt.Errorf("admin token: %s is empty", g.tokenFile)
	}
	return t, nil
}

func (g *globals) client() (*controlapi.AdminClient, error) {
	u, err := url.Parse(g.admin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--admin %q: want http://HOST:PORT or https://HOST:PORT", g.admin)
	}
	token, err := g.token()
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if g.caFile != "" {
		pem, err := os.ReadFile(g.caFile)
		if err != nil {
			return nil, fmt.Errorf("admin CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("admin CA: no certificate in %s", g.caFile)
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	return &controlapi.AdminClient{URL: g.admin, Token: token, HTTP: &http.Client{Transport: tr}}, nil
}

// cli runs the admin commands.
type cli struct {
	g   globals
	out io.Writer
	in  io.Reader
}

// commands maps each admin command's words to its handler.
func (c *cli) commands() map[string]func(context.Context, []string) error {
	return map[string]func(context.Context, []string) error{
		"edge create":     c.edgeCreate,
		"edge list":       c.edgeList,
		"edge show":       c.edgeShow,
		"edge rotate":     c.edgeRotate,
		"edge delete":     c.edgeDelete,
		"task create":     c.taskCreate,
		"task list":       c.taskList,
		"pool list":       c.poolList,
		"pool create":     c.poolCreate,
		"domain publish":  c.domainPublish,
		"domain list":     c.domainList,
		"domain delete":   c.domainDelete,
		"domain rollback": c.domainRollback,
		"key rotate":      c.keyRotate,
		"ca":              c.ca,
	}
}

// flags returns a FlagSet for a command that also carries the global flags.
func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	c.g.register(fs)
	return fs
}

// parse parses a command's flags, checks it got exactly the positional
// arguments named in want, and opens the admin client.
func (c *cli) parse(fs *flag.FlagSet, args []string, want ...string) ([]string, *controlapi.AdminClient, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, nil, err
	}
	if len(pos) != len(want) {
		return nil, nil, fmt.Errorf("usage: cellvisor-control %s", strings.Join(append([]string{fs.Name()}, want...), " "))
	}
	ac, err := c.g.client()
	return pos, ac, err
}

// outputFlag adds -o with the formats allowed, the first the default.
func outputFlag(fs *flag.FlagSet, formats ...string) func() (string, error) {
	o := fs.String("o", formats[0], "output format: "+strings.Join(formats, " or "))
	return func() (string, error) {
		for _, f := range formats {
			if *o == f {
				return f, nil
			}
		}
		return "", fmt.Errorf("%s: unknown output format %q (%s)", fs.Name(), *o, strings.Join(formats, " or "))
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// age shows how long ago t was, or "never".
func age(t *time.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	d := now.Sub(*t)
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
}

func (c *cli) ca(ctx context.Context, args []string) error {
	fs := c.flags("ca")
	_, ac, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	pem, err := ac.CA(ctx)
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	_, err = io.WriteString(c.out, pem)
	return err
}

// list is the shape of every list command: fetch the rows, then print them
// as JSON or as a table with header, one row a line.
func list[T any](ctx context.Context, c *cli, name string, args []string, positional []string,
	fetch func(context.Context, *controlapi.AdminClient, []string) ([]T, error), header string, row func(T, time.Time) string) error {
	fs := c.flags(name)
	format := outputFlag(fs, "table", "json")
	pos, ac, err := c.parse(fs, args, positional...)
	if err != nil {
		return err
	}
	f, err := format()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	rows, err := fetch(ctx, ac, pos)
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(append([]string{name}, pos...), " "), err)
	}
	if f == "json" {
		return printJSON(c.out, rows)
	}
	now := time.Now()
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, row(r, now))
	}
	return tw.Flush()
}

// one is the shape of a command that makes one call and prints its answer
// as JSON.
func one[T any](ctx context.Context, c *cli, name string, args []string, positional []string,
	call func(context.Context, *controlapi.AdminClient, []string) (T, error)) error {
	pos, ac, err := c.parse(c.flags(name), args, positional...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	v, err := call(ctx, ac, pos)
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(append([]string{name}, pos...), " "), err)
	}
	return printJSON(c.out, v)
}
