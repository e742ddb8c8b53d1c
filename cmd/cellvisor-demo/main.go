// Command cellvisor-demo is the developer demo of cellvisor (make demo): it
// runs a control API on SQLite in its own process, starts the agent binary
// (bin/cellvisor) as a child process, enrolls it, publishes a sample domain
// and drives both through their real interfaces: the agent's CLI and the
// control API's admin API. It is not shipped in packages; the agent binary
// links none of it.
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
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "cellvisor-demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := options{out: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "cellvisor-demo",
		Short: "run the cellvisor demo: a control API, an enrolled agent, 8 cell slots",
		Long: `cellvisor-demo starts a control API on SQLite (its data in DIR/control), creates an edge,
runs the agent (bin/cellvisor, found beside this executable, or --agent) as a child
process, enrolls it with the edge's one-time token, and publishes the sample domain
demo.cellvisor.test to shared-default, which cell-01 then serves on loopback port 18080.
Then it shows placement, printing the cellvisor-control line of each step: the pool
reserved-demo with 2 replicas on cell-03 and cell-04 serves reserved.cellvisor.test from
both, and demo.cellvisor.test moves from shared-default into it, step by step, while a
client requests it through the routing view every 50 ms. Then a second edge of the org,
in another region (us-east; the first is in eu-central), runs its own agent with 2 slots
(in DIR/edge-2, on the ports from --http-base+8); both edges get a front door, and two
resolves answer different edges. Egress policies send metering (preferring eu-central)
and siem_forwarding (preferring us-east) to a corp ingest the demo runs: the demo prints
who holds each class's lease, each agent's route, and the bundles the ingest got. It
prints how to reach the cells, the agents and the control API, and runs until Ctrl-C,
which stops both agents (every cell gracefully) and the control API.

The story goes to stdout. The control API's and the agents' logs go to DIR/logs
(control-api.log, demo-edge.log, demo-edge-2.log), started anew by each run and kept
after it; --verbose prints them on stderr too, interleaved with the story.

With --check it runs the scenario of docs/demo.md first: drain, undrain, a publish of revision
2, an operator restart and the restart rate limit's refusal; then the placement steps,
checked (no request failed during the move, the domain ends on cell-03 and cell-04 at a
new revision); the front-door resolves, in the control API and in a cell; and governed
egress: each class with a policy has exactly one holder, in its region, that both agents
agree on, and both edges' bundles of both classes reached the ingest. It exits non-zero
unless every step worked.

One demo runs per directory: a second one is refused. Cells left running by a demo that
was killed (SIGKILL) are found through their pid files and stopped first.`,
		Example: "  cellvisor-demo\n  cellvisor-demo --check",
		Args:    cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return demo(c.Context(), o)
		},
	}
	f := root.Flags()
	f.StringVar(&o.dir, "dir", ".demo", "directory for the demo's files (configuration, state, CA certificate)")
	f.BoolVar(&o.check, "check", false, "run the scenario non-interactively and exit 0 only if every step worked")
	f.BoolVar(&o.verbose, "verbose", false, "print the control API's and the agents' logs on stderr too, interleaved with the story")
	f.StringVar(&o.agent, "agent", "", "the cellvisor agent binary (default: cellvisor beside this executable)")
	f.IntVar(&o.httpBase, "http-base", 18080, "the first cell's HTTP port; the 8 slots use it and the 7 after it (HTTPS: +363); the second edge +8 to +11, the intakes +12 and +13, its metrics +14")
	return cli.Execute(ctx, root, args, stdout, stderr)
}
