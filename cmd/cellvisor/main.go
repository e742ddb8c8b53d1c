// Command cellvisor is the edge-host agent and its operator CLI.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"cellvisor/config"
)

const usage = `usage: cellvisor [--config FILE] COMMAND [ARGS]

commands:
  run                  run the agent (under systemd: Type=notify)
  enroll --control URL --token T [--ca-file F] [--replace]
                       enroll this edge with a control API (once; the token is then spent)
  status [-o json]     show the running agent's slots
  drain CELL           stop advertising readiness; requests in flight complete
  undrain CELL         advertise readiness again
  restart CELL         graceful restart: drain, wait for requests in flight, stop, start
  demo [--check]       run a local demo: 8 slots, cell-01 serving a sample domain
  version              print the version
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "cellvisor:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cellvisor", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage) }
	cfgPath := fs.String("config", config.DefaultPath, "agent configuration file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("no command")
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	switch cmd {
	case "run":
		return cmdRun(ctx, *cfgPath)
	case "enroll":
		return cmdEnroll(ctx, *cfgPath, rest)
	case "status":
		return cmdStatus(ctx, *cfgPath, rest)
	case "drain", "undrain", "restart":
		return cmdControl(ctx, *cfgPath, cmd, rest)
	case "demo":
		return cmdDemo(ctx, rest)
	case "version":
		fmt.Println(versionString())
		return nil
	}
	fs.Usage()
	return fmt.Errorf("unknown command %q", cmd)
}
