// Command cellvisor-control runs the control API (serve) and is its operator
// CLI: every other command talks to the admin API through
// controlapi.AdminClient.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: cellvisor-control [ADMIN FLAGS] COMMAND [ARGS] [FLAGS]

serving:
  serve [--data DIR] [--db URL] [--listen ADDR] [--admin-listen ADDR] [--admin-tls]
        [--hostname H]... [--key-file F] [--admin-token-file F]
        [--log-format json|console] [--log-level LEVEL]
                       run the control API: the edge-control API (TLS) on --listen,
                       the admin API on --admin-listen

administration, through the admin API:
  edge create --name N --org O --country CC --continent XX [--mgmt-ipv4 A] [--mgmt-ipv6 A]
              [--slots N] [--token-ttl D] [--control-url URL] [-o json]
                       create an edge; prints its one-time bootstrap token
  edge list [-o json]  list the edges
  edge show ID         show one edge with its status, acks and tasks (JSON)
  edge rotate ID [--token-ttl D] [--control-url URL] [-o json]
                       refuse the edge's certificate from now on; prints a new token
  edge delete ID       remove a retired edge: its certificate is refused, its
                       manifests, acks and tasks go
  task create EDGE-ID CELL drain|undrain|restart
  task list EDGE-ID [-o json]
  pool list [-o json]
  pool create NAME     NAME: shared-, reserved-, dedicated- or quarantine- and a name
  domain publish NAME --pool P --file F
                       publish the domain's next revision; F is its JSON
                       configuration, - for stdin
  domain list [-o json]
  domain delete NAME   withdraw the domain from every edge
  ca                   print the CA certificate (PEM): agents pass it as --ca-file

admin flags, before or after the command:
  --admin URL          the admin API (default $CELLVISOR_CONTROL_ADMIN, else
                       http://127.0.0.1:8442)
  --token-file F       the admin token (default /var/lib/cellvisor-control/admin.token);
                       $CELLVISOR_ADMIN_TOKEN, when set, is used instead
  --admin-ca-file F    the CA certificate to trust when the admin API is https
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "cellvisor-control:", err)
		os.Exit(1)
	}
}

// run runs one command, writing its output to stdout.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("cellvisor-control", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage) }
	c := &cli{g: defaultGlobals(), out: stdout, in: os.Stdin}
	c.g.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return errors.New("no command")
	}
	if rest[0] == "serve" {
		return cmdServe(ctx, rest[1:])
	}
	cmds := c.commands()
	if h, ok := cmds[rest[0]]; ok {
		return h(ctx, rest[1:])
	}
	if len(rest) >= 2 {
		if h, ok := cmds[rest[0]+" "+rest[1]]; ok {
			return h(ctx, rest[2:])
		}
		fs.Usage()
		return fmt.Errorf("unknown command %q", rest[0]+" "+rest[1])
	}
	fs.Usage()
	return fmt.Errorf("unknown command %q", rest[0])
}

// parseArgs parses fs's flags wherever they stand among args (package flag
// stops at the first positional argument), so that flags may follow the
// command's words, and returns the positional arguments. Everything after
// "--" is positional.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}
