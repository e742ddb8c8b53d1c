package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"cellvisor/config"
	"cellvisor/controlclient"
)

// cmdEnroll enrolls this edge with a control API: the only time the
// bootstrap token is needed.
func cmdEnroll(ctx context.Context, cfgPath string, args []string) error {
	fs := flag.NewFlagSet("enroll", flag.ContinueOnError)
	control := fs.String("control", "", "the edge-control API's URL (https://host:port)")
	token := fs.String("token", "", "the one-time bootstrap token (or CELLVISOR_TOKEN)")
	caFile := fs.String("ca-file", "", "CA certificate to trust for the control API and pin (default: the system's roots)")
	replace := fs.Bool("replace", false, "enroll again over an existing identity, after an identity rotation")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *token == "" {
		*token = os.Getenv("CELLVISOR_TOKEN")
	}
	if *control == "" || *token == "" {
		return errors.New("enroll needs --control URL and --token TOKEN")
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	id, err := controlclient.Enroll(ctx, controlclient.EnrollOptions{
		URL: *control, Token: *token, CAFile: *caFile, Dir: cfg.IdentityDir(), IdentityFile: cfg.Identity(),
		Slots: cfg.Slots, Replace: *replace,
	})
	if err != nil {
		return err
	}
	fmt.Printf("enrolled as edge %s with %s (%d slots); identity in %s\n", id.EdgeID, id.ControlURL, id.Slots, cfg.IdentityDir())
	fmt.Println("the bootstrap token is no longer needed; start the agent (cellvisor run, or systemctl restart cellvisor)")
	return nil
}
