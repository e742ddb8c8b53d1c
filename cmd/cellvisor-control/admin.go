package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/controlapi/adminapi"
	"cellvisor/internal/cli"
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

// register adds the global flags to root, for every command below it.
func (g *globals) register(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringVar(&g.admin, "admin", g.admin, "the admin API's URL ($CELLVISOR_CONTROL_ADMIN)")
	f.StringVar(&g.tokenFile, "token-file", g.tokenFile, "the admin token file; $CELLVISOR_ADMIN_TOKEN, when set, is used instead")
	f.StringVar(&g.caFile, "admin-ca-file", g.caFile, "the CA certificate (PEM) to trust when the admin API is https")
}

// token is $CELLVISOR_ADMIN_TOKEN, or else the token file's content; from
// says which.
func (g *globals) token() (token, from string, err error) {
	if t := os.Getenv("CELLVISOR_ADMIN_TOKEN"); t != "" {
		return t, "$CELLVISOR_ADMIN_TOKEN", nil
	}
	data, err := os.ReadFile(g.tokenFile)
	if err != nil {
		return "", "", fmt.Errorf("admin token: %w (set CELLVISOR_ADMIN_TOKEN or pass --token-file)", err)
	}
	t := strings.TrimSpace(string(data))
	if t == "" {
		return "", "", fmt.Errorf("admin token: %s is empty", g.tokenFile)
	}
	return t, g.tokenFile, nil
}

// client opens the admin API's client; from says where its token came from.
func (g *globals) client() (ac *adminapi.Client, from string, err error) {
	u, err := url.Parse(g.admin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, "", fmt.Errorf("--admin %q: want http://HOST:PORT or https://HOST:PORT", g.admin)
	}
	token, from, err := g.token()
	if err != nil {
		return nil, "", err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if g.caFile != "" {
		pem, err := os.ReadFile(g.caFile)
		if err != nil {
			return nil, "", fmt.Errorf("admin CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("admin CA: no certificate in %s", g.caFile)
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	return &adminapi.Client{URL: g.admin, Token: token, HTTP: &http.Client{Transport: tr}}, from, nil
}

// TokenRejectedError is the admin API's 401 to a request that carried a
// token (the CLI never sends none): the token is wrong, not missing.
type TokenRejectedError struct {
	From string // $CELLVISOR_ADMIN_TOKEN or the token file
	Err  *adminapi.Error
}

func (e *TokenRejectedError) Error() string {
	return fmt.Sprintf("the admin API rejected the admin token from %s (HTTP 401): use the token the control API wrote "+
		"(its admin.token) with --token-file FILE or $CELLVISOR_ADMIN_TOKEN", e.From)
}

func (e *TokenRejectedError) Unwrap() error { return e.Err }

// app runs the admin commands.
type app struct {
	g   globals
	out io.Writer
	in  io.Reader
}

// adminCmd is an admin command: it opens the admin client and runs call
// with a bounded context; errors name the command and its arguments.
func (c *app) adminCmd(cmd *cobra.Command, call func(ctx context.Context, ac *adminapi.Client, args []string) error) *cobra.Command {
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ac, from, err := c.g.client()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), adminTimeout)
		defer cancel()
		if err := call(ctx, ac, args); err != nil {
			var ae *adminapi.Error
			if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
				err = &TokenRejectedError{From: from, Err: ae}
			}
			return fmt.Errorf("%s: %w", strings.Join(append([]string{strings.TrimPrefix(cmd.CommandPath(), "cellvisor-control ")}, args...), " "), err)
		}
		return nil
	}
	return cmd
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

func (c *app) ca() *cobra.Command {
	return c.adminCmd(&cobra.Command{
		Use:     "ca",
		Short:   "print the CA certificate (PEM): agents pass it as --ca-file",
		Example: "  cellvisor-control ca > ca.pem",
		Args:    cli.ExactArgs(0),
	}, func(ctx context.Context, ac *adminapi.Client, _ []string) error {
		pem, err := ac.CA(ctx)
		if err != nil {
			return err
		}
		_, err = io.WriteString(c.out, pem)
		return err
	})
}

// listCmd is the shape of every list command: fetch the rows, then print
// them as JSON or as a table with header, one row a line.
func listCmd[T any](c *app, cmd *cobra.Command, fetch func(context.Context, *adminapi.Client, []string) ([]T, error),
	header string, row func(T, time.Time) string) *cobra.Command {
	format := cli.Output(cmd, "table", "json")
	return c.adminCmd(cmd, func(ctx context.Context, ac *adminapi.Client, args []string) error {
		f, err := format()
		if err != nil {
			return err
		}
		rows, err := fetch(ctx, ac, args)
		if err != nil {
			return err
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
	})
}

// oneCmd is the shape of a command that makes one call and prints its
// answer, by text (nil: JSON only) or as JSON with -o json.
func oneCmd[T any](c *app, cmd *cobra.Command, call func(context.Context, *adminapi.Client, []string) (T, error),
	text func(io.Writer, T, time.Time) error) *cobra.Command {
	format := func() (string, error) { return "json", nil }
	if text != nil {
		format = cli.Output(cmd, "text", "json")
	}
	return c.adminCmd(cmd, func(ctx context.Context, ac *adminapi.Client, args []string) error {
		f, err := format()
		if err != nil {
			return err
		}
		v, err := call(ctx, ac, args)
		if err != nil {
			return err
		}
		if f == "json" {
			return printJSON(c.out, v)
		}
		return text(c.out, v, time.Now())
	})
}
