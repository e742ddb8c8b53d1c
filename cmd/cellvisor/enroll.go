package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/config"
	"cellvisor/controlclient"
)

// enrollCmd enrolls this edge with a control API: the only time the
// bootstrap token is needed.
func enrollCmd(load func() (config.Agent, error), stdout io.Writer) *cobra.Command {
	var o struct {
		control, token, caFile string
		replace                bool
	}
	c := &cobra.Command{
		Use:   "enroll --control URL --token TOKEN [--ca-file FILE] [--replace]",
		Short: "enroll this edge with a control API (once: the token is then spent)",
		Long: `Enroll this edge with the control API's edge-control endpoint: generate a key, have its
certificate signed with the one-time bootstrap token, and write the identity into the
configuration's identity directory. Run it as the agent's user, then restart the agent.`,
		Example: "  cellvisor enroll --control https://control.example.net:8443 --token cvt_… --ca-file ca.pem",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if o.token == "" {
				o.token = os.Getenv("CELLVISOR_TOKEN")
			}
			if o.control == "" || o.token == "" {
				return errors.New("enroll needs --control URL and --token TOKEN (or CELLVISOR_TOKEN)")
			}
			cfg, err := load()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context(), 2*time.Minute)
			defer cancel()
			id, err := controlclient.Enroll(ctx, controlclient.EnrollOptions{
				URL: o.control, Token: o.token, CAFile: o.caFile, Dir: cfg.IdentityDir(), IdentityFile: cfg.Identity(),
				Slots: cfg.Slots, Replace: o.replace,
			})
			if err != nil {
				return fmt.Errorf("enroll: %w", err)
			}
			fmt.Fprintf(stdout, "enrolled as edge %s with %s (%d slots); identity in %s\n", id.EdgeID, id.ControlURL, id.Slots, cfg.IdentityDir())
			fmt.Fprintln(stdout, "the bootstrap token is no longer needed; start the agent (cellvisor run, or systemctl restart cellvisor)")
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&o.control, "control", "", "the edge-control API's URL (https://host:port)")
	f.StringVar(&o.token, "token", "", "the one-time bootstrap token (or $CELLVISOR_TOKEN)")
	f.StringVar(&o.caFile, "ca-file", "", "CA certificate to trust for the control API and pin (default: the system's roots)")
	f.BoolVar(&o.replace, "replace", false, "enroll again over an existing identity, after an identity rotation")
	return c
}
