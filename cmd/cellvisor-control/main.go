// Command cellvisor-control runs the control API (serve) and is its operator
// CLI: every other command talks to the admin API through
// adminapi.Client.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"cellvisor/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "cellvisor-control:", cli.Printable(err.Error()))
		os.Exit(1)
	}
}

// run runs one command line: its output goes to stdout, help too.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c := &app{g: defaultGlobals(), out: stdout, in: stdin}
	return cli.Execute(ctx, c.root(), args, stdout, stderr)
}

// root builds the command tree.
func (c *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "cellvisor-control",
		Short: "the cellvisor control API (serve) and its admin CLI",
		Long: `cellvisor-control serves the control API (serve): the edge-control API that agents poll
over mutual TLS, and the admin API. Every other command is an admin command: it calls
the admin API at --admin with the admin token.

The admin flags (--admin, --token-file, --admin-ca-file) may stand before or after the
command.`,
	}
	c.g.register(root)
	edge := &cobra.Command{Use: "edge", Short: "create, list, show, update, rotate and delete edges"}
	edge.AddCommand(c.edgeCreate(), c.edgeList(), c.edgeShow(), c.edgeRotate(), c.edgeDelete(), c.edgeUpdate())
	task := &cobra.Command{Use: "task", Short: "drain, undrain or restart an edge's cell (delivered by its next poll)"}
	task.AddCommand(c.taskCreate(), c.taskList())
	pool := &cobra.Command{Use: "pool", Short: "create, show, list, update and delete pools"}
	pool.AddCommand(c.poolList(), c.poolCreate(), c.poolShow(), c.poolUpdate(), c.poolDelete())
	cell := &cobra.Command{Use: "cell", Short: "assign an edge's cells to pools"}
	cell.AddCommand(c.cellAssign(), c.cellUnassign())
	domain := &cobra.Command{Use: "domain", Short: "publish, list, delete and roll back domains"}
	domain.AddCommand(c.domainPublish(), c.domainList(), c.domainShow(), c.domainDelete(), c.domainRollback(), c.domainMove(), c.domainRouting())
	key := &cobra.Command{Use: "key", Short: "rotate the control plane's signing key"}
	key.AddCommand(c.keyRotate())
	root.AddCommand(serveCmd(), edge, task, pool, cell, domain, key, c.certCmd(), c.frontDoorCmd(), c.ca(), c.egressCmd())
	return root
}
