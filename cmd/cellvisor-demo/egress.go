package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"cellvisor/cellapi"
	"cellvisor/config"
	"cellvisor/controlapi/adminapi"
	"cellvisor/edgeapi"
	"cellvisor/supervisor"
)

// The demo's org has two edges in two regions: demo-edge (eu-central, 8
// slots) and demo-edge-2 (us-east, 2 slots, in .demo/edge-2 with its own
// state, ports, cgroup subtree and intake). Governed egress sends their
// metering and siem_forwarding bundles to a corp ingest the demo runs;
// each class's policy prefers one region, so each edge holds one class's
// lease and forwards the other class's bundles to its peer's intake.
const (
	demoOrg    = "demo"
	regionEU   = "eu-central"
	regionUS   = "us-east"
	edge2Dir   = "edge-2"
	edge2Name  = "demo-edge-2"
	edge2Slots = 2
	// egressWait bounds the wait for the leases and the bundles.
	egressWait = 60 * time.Second
	// sharedHost is published to shared-default once the second edge is
	// enrolled: both edges' cell-01 serve it.
	sharedHost = "shared.cellvisor.test"
	sharedBody = "hello from cellvisor: shared.cellvisor.test, shared-default on both edges\n"
)

// demoClasses are the classes with a policy and the region each prefers.
var demoClasses = []struct{ class, region string }{{"metering", regionEU}, {"siem_forwarding", regionUS}}

func ptr[T any](v T) *T { return &v }

// edge2Subtree is the second agent's cgroup subtree.
func edge2Subtree(root string) string { return demoSubtree(root) + "-2" }

// edge2 is the second edge's agent.
type edge2 struct {
	spec  agentSpec
	cfg   config.Agent
	id    string
	cli   agentCLI
	agent *agentProc
}

// stop stops the second agent (every cell gracefully), bounded.
func (d *edge2) stop() error {
	if d.agent == nil {
		return nil
	}
	err := d.agent.stop(agentStopWait)
	_ = os.Remove(filepath.Join(d.spec.dir, agentPidFile))
	return err
}

// egressPolicies sets the org's policies: metering and siem_forwarding to
// the corp ingest, each preferring its region.
func (e *env) egressPolicies(ctx context.Context) error {
	for _, c := range demoClasses {
		if _, err := e.admin.SetEgressPolicy(ctx, demoOrg, c.class, adminapi.EgressPolicyRequest{Destination: e.ingestURL, Region: c.region}); err != nil {
			return fmt.Errorf("egress policy %s: %w", c.class, err)
		}
		fmt.Fprintf(e.o.out, "$ $CTL egress policy set %s %s --destination %s --region %s\n", demoOrg, c.class, e.ingestURL, c.region)
	}
	return nil
}

// startEdge2 creates the second edge in us-east, enrolls and starts its
// agent, and waits until its cell-01 answers.
func (e *env) startEdge2(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	base := e.o.httpBase
	spec := agentSpec{dir: filepath.Join(e.root, edge2Dir), slots: edge2Slots, httpBase: base + 8, httpsBase: base + 10,
		subtree: edge2Subtree(e.root), intake: base + 13, region: regionUS, metrics: fmt.Sprintf("127.0.0.1:%d", base+14), resolver: e.spec.resolver}
	cfgPath, cfg, err := writeConfig(spec, e.nginx, e.modules, e.o.out)
	if err != nil {
		return err
	}
	created, err := e.admin.CreateEdge(ctx, adminapi.EdgeRequest{Name: edge2Name, Org: demoOrg, Country: "US", Continent: "NA",
		MgmtIPv4: "127.0.0.1", Slots: edge2Slots, EdgeUpdateRequest: adminapi.EdgeUpdateRequest{Region: ptr(regionUS)}})
	if err != nil {
		return fmt.Errorf("create edge %s: %w", edge2Name, err)
	}
	out := e.o.out
	fmt.Fprintf(out, "\nA second edge of org %s, in another region:\n", demoOrg)
	fmt.Fprintf(out, "$ $CTL edge create --name %s --org %s --country US --continent NA --region %s --slots %d\ncreated edge %s\n",
		edge2Name, demoOrg, regionUS, edge2Slots, created.Edge.ID)
	d := &edge2{spec: spec, cfg: cfg, id: created.Edge.ID, cli: agentCLI{bin: e.cli.bin, cfg: cfgPath}}
	caFile := filepath.Join(e.root, "ca.pem")
	enrolled, err := d.cli.run(ctx, "enroll", "--control", e.ep.EdgeURL, "--token", created.Token, "--ca-file", caFile)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "$ ./bin/cellvisor --config %s enroll --control %s --token cvt_… --ca-file %s\n%s", relPath(cfgPath), e.ep.EdgeURL, relPath(caFile), enrolled)
	// An edge's first manifest comes with a domain for its cells.
	p, err := e.admin.Publish(ctx, sharedHost, adminapi.DomainRequest{Pool: "shared-default", Config: domainConfig(sharedHost, sharedBody)})
	if err != nil {
		return fmt.Errorf("publish %s: %w", sharedHost, err)
	}
	fmt.Fprintf(out, "$ $CTL domain publish %s --pool shared-default --file -\npublished %s revision %d to shared-default; %d edge(s) build it into their manifest at their next poll\n",
		sharedHost, sharedHost, p.Domain.Revision, p.EdgesPending)
	logs, err := e.logs.file(edge2AgentLog)
	if err != nil {
		return err
	}
	a, err := startAgent(e.cli.bin, cfgPath, logs)
	if err != nil {
		return err
	}
	d.agent, e.edge2 = a, d
	if err := writeAgentPid(spec.dir, a.pid()); err != nil {
		fmt.Fprintf(out, "warning: cannot record the second agent's pid: %v\n", err)
	}
	// Both edges' cell-01 serve it once each agent applied its manifest.
	cellURL := fmt.Sprintf("http://127.0.0.1:%d/", spec.httpBase)
	for _, c := range []struct {
		url   string
		agent *agentProc
	}{{cellURL, a}, {e.cellURL, e.agent}} {
		err = poll(ctx, func() error {
			select {
			case <-c.agent.exited:
				return errAgentExited{c.agent.err}
			default:
			}
			got, err := get(ctx, c.url, sharedHost)
			if err == nil && got != sharedBody {
				err = fmt.Errorf("got %q", got)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("%s never served %s: %w", c.url, sharedHost, err)
		}
	}
	fmt.Fprintf(out, "$ ./bin/cellvisor --config %s run\n$ curl -H 'Host: %s' %s    # %s's cell-01\n%s",
		relPath(cfgPath), sharedHost, cellURL, edge2Name, sharedBody)
	e.printApplied(ctx, "cell-01")
	return nil
}

// printApplied says how the first edge's cell took its last release: a
// running cell loads a data publish, its worker and connections untouched.
func (e *env) printApplied(ctx context.Context, cell string) {
	st, err := e.cli.status(ctx)
	if err != nil {
		return
	}
	for _, s := range st.Slots {
		if s.Name != cell || s.Applied == nil {
			continue
		}
		fmt.Fprintf(e.o.out, "%s's %s took it: %s", e.edgeName, cell, s.Applied)
		if s.Applied.How == supervisor.HowLoaded {
			fmt.Fprintf(e.o.out, " (the same worker, its connections untouched; %d reloads since the agent started)", s.Reloads)
		}
		fmt.Fprintln(e.o.out)
	}
}

// egress makes traffic on both edges (requests, and private calls with a
// wrong secret: security events), waits until each class has one holder
// that both agents agree on, in the class's region, and the corp ingest
// got both edges' bundles of both classes, then prints the leases, the
// agents' routes and what the ingest got. With --check, any of that not
// true within egressWait fails the demo; otherwise it is printed as it is.
func (e *env) egress(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, egressWait)
	defer cancel()
	out := e.o.out
	d := e.edge2
	edges := []struct {
		name, id string
		spec     agentSpec
		cli      agentCLI
	}{{e.edgeName, e.edgeID, e.spec, e.cli}, {edge2Name, d.id, d.spec, d.cli}}
	for _, ed := range edges {
		url := fmt.Sprintf("http://127.0.0.1:%d/", ed.spec.httpBase)
		for range 5 {
			if _, _, err := fetch(ctx, url, sharedHost); err != nil {
				return err
			}
		}
		if err := refusedCalls(ctx, filepath.Join(ed.spec.dir, "run", "cell-01", "private.sock"), 2); err != nil {
			return fmt.Errorf("%s: %w", ed.name, err)
		}
	}
	fmt.Fprintf(out, "\nGoverned egress: 5 requests on each edge's cell-01 (metering), 2 private calls with a wrong secret on each (refused: siem_forwarding)\n")

	names := map[string]string{e.edgeID: e.edgeName, d.id: edge2Name}
	want := map[string]string{"metering": e.edgeID, "siem_forwarding": d.id}
	var leases []adminapi.LeaseView
	var routes [2][]edgeapi.RouteStatus
	err := poll(ctx, func() error {
		var err error
		if leases, err = e.admin.Leases(ctx, demoOrg); err != nil {
			return err
		}
		var errs []error
		for _, c := range demoClasses {
			i := slices.IndexFunc(leases, func(l adminapi.LeaseView) bool { return l.Class == c.class })
			switch {
			case i < 0:
				errs = append(errs, fmt.Errorf("%s: no lease", c.class))
			case leases[i].Expired:
				errs = append(errs, fmt.Errorf("%s: the lease of %s expired", c.class, leases[i].Holder))
			case leases[i].Holder != want[c.class]:
				errs = append(errs, fmt.Errorf("%s: held by %s, want %s (region %s)", c.class, names[leases[i].Holder], names[want[c.class]], c.region))
			}
		}
		for i, ed := range edges {
			st, err := ed.cli.status(ctx)
			if err != nil {
				return err
			}
			if st.Egress == nil {
				return fmt.Errorf("%s: status shows no egress", ed.name)
			}
			routes[i] = st.Egress.Routes
		}
		errs = append(errs, agreeOnHolders(routes, [2]string{e.edgeID, d.id}, want))
		for _, c := range demoClasses {
			for _, ed := range edges {
				if n := e.ingested(c.class, ed.id); n == 0 {
					errs = append(errs, fmt.Errorf("%s: no bundle of %s ingested yet", c.class, ed.name))
				}
			}
		}
		return errors.Join(errs...)
	})
	if err != nil && e.o.check {
		return fmt.Errorf("check governed egress: %w", err)
	}
	if err != nil {
		fmt.Fprintf(out, "not every class settled within %s (shown as it is): %v\n", egressWait, err)
	}

	fmt.Fprintf(out, "$ $CTL egress leases --org %s\n", demoOrg)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tHOLDER\tNAME\tREGION\tEPOCH\tEXPIRES")
	now := time.Now()
	for _, l := range leases {
		exp := "in " + l.ExpiresAt.Sub(now).Round(time.Second).String()
		if l.Expired {
			exp = "expired"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", l.Class, l.Holder, names[l.Holder], l.Region, l.Epoch, exp)
	}
	tw.Flush()
	for i, ed := range edges {
		for _, r := range routes[i] {
			if !slices.ContainsFunc(demoClasses, func(c struct{ class, region string }) bool { return c.class == r.Class }) {
				continue
			}
			how := r.Route
			switch {
			case r.Route == edgeapi.RouteDirect && r.Holder == ed.id:
				how = "direct (holds the lease)"
			case r.Route == edgeapi.RouteProxy:
				how = fmt.Sprintf("proxy via %s's intake %s", names[r.Holder], r.HolderURL)
			}
			fmt.Fprintf(out, "%s: %s %s, epoch %d\n", ed.name, r.Class, how, r.Epoch)
		}
	}
	fmt.Fprintf(out, "corp ingest %s:\n", e.ingestURL)
	for _, c := range demoClasses {
		fmt.Fprintf(out, "  %s: %s\n", c.class, e.ingestSummary(c.class, names))
	}
	if e.o.check && err == nil {
		fmt.Fprintf(out, "check: each class has exactly one holder, in its region, that both agents agree on; both edges' bundles of both classes were ingested\n")
	}
	return nil
}

// agreeOnHolders checks the two agents' routes: for every class with a
// policy exactly one agent sends direct as the holder want names, and the
// other forwards to it.
func agreeOnHolders(routes [2][]edgeapi.RouteStatus, ids [2]string, want map[string]string) error {
	var errs []error
	for class, holder := range want {
		direct := 0
		for i := range routes {
			j := slices.IndexFunc(routes[i], func(r edgeapi.RouteStatus) bool { return r.Class == class })
			if j < 0 {
				errs = append(errs, fmt.Errorf("%s: %s has no route", class, ids[i]))
				continue
			}
			r := routes[i][j]
			switch {
			case r.Route == edgeapi.RouteDirect && r.Holder == ids[i]:
				direct++
				if ids[i] != holder {
					errs = append(errs, fmt.Errorf("%s: %s sends direct as the holder, want %s", class, ids[i], holder))
				}
			case r.Route == edgeapi.RouteProxy && r.Holder == holder:
			default:
				errs = append(errs, fmt.Errorf("%s: %s routes %s via %s (%s)", class, ids[i], r.Route, r.Holder, r.Reason))
			}
		}
		if direct != 1 {
			errs = append(errs, fmt.Errorf("%s: %d agents send as the holder, want exactly 1", class, direct))
		}
	}
	return errors.Join(errs...)
}

// ingested counts the ingested bundles of class produced by origin.
func (e *env) ingested(class, origin string) int {
	n := 0
	for id := range e.ingest.IDs() {
		if b, ok := e.ingest.Bundle(id); ok && b.Class == class && b.Origin == origin {
			n++
		}
	}
	return n
}

// ingestSummary says how many bundles of class arrived, from which edge,
// and who sent them under which epoch (0: a fallback send).
func (e *env) ingestSummary(class string, names map[string]string) string {
	var from, by []string
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range names {
			if !yield(id) {
				return
			}
		}
	}) {
		if n := e.ingested(class, id); n > 0 {
			from = append(from, fmt.Sprintf("%d from %s", n, names[id]))
		}
	}
	for k, c := range e.ingest.ByKey() {
		if k.Class == class {
			by = append(by, fmt.Sprintf("%d sent by %s under epoch %d", c.Received, names[k.Sender], k.Epoch))
		}
	}
	slices.Sort(by)
	if len(from) == 0 {
		return "none yet"
	}
	return fmt.Sprintf("%d bundles (%s); %s", e.ingest.Class(class).Unique, strings.Join(from, ", "), strings.Join(by, ", "))
}

// refusedCalls makes n calls on a cell's private socket with a wrong
// secret: the cell refuses each and counts it, a security event.
func refusedCalls(ctx context.Context, sock string, n int) error {
	cl := cellapi.New(sock, []byte("not the cell's secret, only a demo"))
	defer cl.Close()
	for range n {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := cl.Status(cctx)
		cancel()
		if err == nil {
			return fmt.Errorf("a private call with a wrong secret on %s was answered", sock)
		}
	}
	return nil
}
