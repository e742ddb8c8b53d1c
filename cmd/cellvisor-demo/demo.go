package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/runtime"
	"cellvisor/testkit/corpingest"
)

const (
	demoHost = "demo.cellvisor.test"
	demoBody = "hello from cellvisor: demo.cellvisor.test served by cell-01 (shared-default)\n"
	// readyWait bounds the start: cells ready, the manifest served and acked.
	readyWait = 90 * time.Second
	// controlDir, in the demo's directory, holds the control API's data
	// (its SQLite database, CA, admin token) while the demo runs.
	controlDir = "control"
)

// shortPath is path relative to the working directory when it lies below
// it (.demo/control/admin.token), else as it is: for the lines the demo
// prints for copying.
func shortPath(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	if rel, err := filepath.Rel(wd, path); err == nil && filepath.IsLocal(rel) {
		return rel
	}
	return path
}

// options are the demo's flags.
type options struct {
	dir      string
	check    bool
	verbose  bool
	agent    string
	httpBase int
	out      io.Writer
	// stderr is where --verbose copies the logs.
	stderr io.Writer
}

// env is a running demo: its files, the control API and the agent.
type env struct {
	o        options
	root     string
	caFile   string // the demo CA's certificate (tls/ca.pem), once made
	cfgPath  string
	cfg      config.Agent
	ep       controlapi.Endpoints
	admin    *adminapi.Client
	edgeID   string
	edgeName string
	cli      agentCLI
	agent    *agentProc
	spec     agentSpec
	nginx    string
	modules  []string
	// edge2 is the second edge, in another region of the org, once
	// started.
	edge2 *edge2
	logs  *demoLogs
	// ingest is the corp ingest, the destination of the egress policies.
	ingest    *corpingest.Server
	ingestURL string
	// originAddr is the sample domain's origin (host:port), by name in its URL.
	originAddr string
	cellURL    string
	tokenRel   string
	// body is what the sample domain's latest revision answers.
	body string
}

func demo(ctx context.Context, o options) error {
	if o.httpBase < 1024 || o.httpBase+363+8 > 65535 {
		return fmt.Errorf("--http-base %d: want 1024..%d", o.httpBase, 65535-363-8)
	}
	agentBin, err := findAgent(o.agent)
	if err != nil {
		return err
	}
	nginx, modules, err := runtime.FindOpenResty()
	if err != nil {
		return fmt.Errorf("%w (run: make deps)", err)
	}
	root, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	// The lock comes before anything in the directory is touched.
	lock, err := lockDir(root)
	if err != nil {
		return err
	}
	defer lock.release()
	subtree := demoSubtree(root)
	for _, lo := range []leftovers{
		{root: root, agentBin: agentBin, nginx: nginx, subtree: subtree, out: o.out},
		{root: filepath.Join(root, edge2Dir), agentBin: agentBin, nginx: nginx, subtree: edge2Subtree(root), out: o.out},
	} {
		if err := lo.stop(ctx); err != nil {
			return fmt.Errorf("stop what an earlier demo left running: %w", err)
		}
	}
	// Every run is a new edge of a new control plane: no identity, topology
	// or release of an earlier run is kept.
	for _, d := range []string{"state", "run", controlDir, agentPidFile, edge2Dir} {
		if err := os.RemoveAll(filepath.Join(root, d)); err != nil {
			return err
		}
	}
	e := &env{o: o, root: root}
	e.spec = agentSpec{dir: root, slots: 8, httpBase: o.httpBase, httpsBase: o.httpBase + 363, subtree: subtree,
		intake: o.httpBase + 12, region: regionEU, metrics: "127.0.0.1:9464", resolver: fmt.Sprintf("127.0.0.1:%d", o.httpBase+15)}
	if e.cfgPath, e.cfg, err = writeConfig(e.spec, nginx, modules, o.out); err != nil {
		return err
	}
	e.nginx, e.modules = nginx, modules
	e.cli = agentCLI{bin: agentBin, cfg: e.cfgPath}
	e.cellURL = fmt.Sprintf("http://127.0.0.1:%d/", o.httpBase)

	if e.logs, err = openLogs(root, o.verbose, o.stderr); err != nil {
		return err
	}
	defer e.logs.close()
	defer fmt.Fprintf(o.out, "\n%s\n", e.logs.where())
	ctlLog, err := e.logs.file(controlLog)
	if err != nil {
		return err
	}
	log := fileLogger(ctlLog)
	defer log.Sync() //nolint:errcheck // the file is closed after it
	// The control API's data lives in the demo's directory, not the
	// system's temporary one: a demo killed before it could remove it
	// leaves it where the next demo (and make clean) removes it.
	data := filepath.Join(root, controlDir)
	if err := os.Mkdir(data, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(data)

	// 1. The control API, on SQLite in DIR/control, in this process.
	ctlCtx, stopCtl := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCtl()
	ready := make(chan controlapi.Endpoints, 1)
	ctlDone := make(chan error, 1)
	go func() {
		// A short move tick and ready bound: the demo's move takes seconds.
		ctlDone <- controlapi.Serve(ctlCtx, controlapi.Config{Data: data, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
			MoveTick: moveTick, MoveReadyWithin: moveReadyWithin,
			Logger: log.Named("cellvisor-control")}, func(ep controlapi.Endpoints) { ready <- ep })
	}()
	select {
	case e.ep = <-ready:
	case err := <-ctlDone:
		return fmt.Errorf("control API: %w", err)
	case <-ctx.Done():
		stopCtl()
		return errors.Join(ctx.Err(), <-ctlDone)
	}
	e.admin = &adminapi.Client{URL: e.ep.AdminURL, Token: e.ep.AdminToken}
	e.tokenRel = shortPath(filepath.Join(data, "admin.token"))
	// The corp ingest: the egress policies' destination, on loopback.
	e.ingest = corpingest.New()
	ingestSrv := httptest.NewServer(e.ingest)
	defer ingestSrv.Close()
	e.ingestURL = ingestSrv.URL + "/ingest"
	// The sample domain's origin, given by name, and the DNS server that
	// answers it.
	e.originAddr = fmt.Sprintf("127.0.0.1:%d", o.httpBase+16)
	stopOrigin, err := startOrigin(e.originAddr)
	if err != nil {
		stopCtl()
		return errors.Join(err, <-ctlDone)
	}
	defer stopOrigin()
	stopDNS, err := startDNS(e.spec.resolver)
	if err != nil {
		stopCtl()
		return errors.Join(err, <-ctlDone)
	}
	defer stopDNS()

	err = e.runAgent(ctx)
	stopCtl()
	if cerr := <-ctlDone; cerr != nil {
		err = errors.Join(err, fmt.Errorf("control API: %w", cerr))
	}
	if err != nil {
		return err
	}
	if o.check {
		fmt.Fprintln(o.out, "demo check: every step worked")
	}
	return nil
}

// runAgent enrolls the agent, starts it, runs the scenario and stops it.
func (e *env) runAgent(ctx context.Context) error {
	if err := e.enroll(ctx); err != nil {
		return err
	}
	logs, err := e.logs.file(agentLog)
	if err != nil {
		return err
	}
	a, err := startAgent(e.cli.bin, e.cfgPath, logs)
	if err != nil {
		return err
	}
	e.agent = a
	if err := writeAgentPid(e.root, a.pid()); err != nil {
		fmt.Fprintf(e.o.out, "warning: cannot record the agent's pid: %v\n", err)
	}
	err = e.steps(ctx)
	// Ctrl-C reached the agents too (same process group): they are
	// stopping. Both are waited for at once.
	var serr2 error
	stopped2 := make(chan struct{})
	go func() {
		defer close(stopped2)
		if e.edge2 != nil {
			serr2 = e.edge2.stop()
		}
	}()
	if serr := a.stop(agentStopWait); serr != nil {
		err = errors.Join(err, fmt.Errorf("agent: %w", serr))
	}
	<-stopped2
	if serr2 != nil {
		err = errors.Join(err, fmt.Errorf("second agent: %w", serr2))
	}
	_ = os.Remove(filepath.Join(e.root, agentPidFile))
	if err == nil && e.o.check {
		err = e.checkCleanedUp()
	}
	return err
}

// steps waits until cell-01 serves the published domain, shows the demo's
// state, then runs the check scenario or waits for Ctrl-C.
func (e *env) steps(ctx context.Context) error {
	wait, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	if err := e.awaitServing(wait, demoBody); err != nil {
		return err
	}
	var view adminapi.EdgeView
	err := poll(wait, func() error {
		var err error
		view, err = e.admin.Edge(wait, e.edgeID)
		if err == nil && (view.ActiveSequence < 1 || view.ActiveSequence < view.Sequence) {
			err = fmt.Errorf("active sequence %d", view.ActiveSequence)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("the control API never got the edge's ack: %w", err)
	}
	table, err := e.cli.run(ctx, "status")
	if err != nil {
		return err
	}
	out := e.o.out
	fmt.Fprintf(out, "\n$ ./bin/cellvisor status --config %s\n%s", relPath(e.cfgPath), table)
	fmt.Fprintf(out, "\n$ curl -H 'Host: %s' %s\n%s", demoHost, e.cellURL, demoBody)
	proxied, err := get(ctx, e.cellURL+strings.TrimPrefix(originRoute, "/")+"hello", demoHost)
	if err != nil || proxied != originBody(originRoute+"hello") {
		return fmt.Errorf("the sample domain's %s route: %q, %v", originRoute, proxied, err)
	}
	fmt.Fprintf(out, "$ curl -H 'Host: %s' %s%shello\n%s", demoHost, e.cellURL, strings.TrimPrefix(originRoute, "/"), proxied)
	// And over HTTPS, with the certificate the control API sealed to
	// this edge.
	var secure, proto string
	err = poll(wait, func() error {
		var err error
		secure, proto, err = e.getHTTPS(wait, "/")
		return err
	})
	if err != nil || secure != demoBody {
		return fmt.Errorf("the sample domain over HTTPS: %q, %v", secure, err)
	}
	fmt.Fprintf(out, "$ curl --cacert %s --resolve %s:%d:127.0.0.1 https://%s:%d/    # %s\n%s",
		relPath(e.caFile), demoHost, e.spec.httpsBase, demoHost, e.spec.httpsBase, proto, secure)
	fmt.Fprintf(out, "\ncontrol API says: edge %s %s, sequence %d, active (acked) %d\n", view.Name, view.Enrollment, view.Sequence, view.ActiveSequence)
	if e.o.check {
		if err := e.check(ctx); err != nil {
			return err
		}
	}
	if err := e.placement(ctx); err != nil {
		return err
	}
	if err := e.startEdge2(ctx); err != nil {
		return err
	}
	if err := e.frontDoor(ctx); err != nil {
		return err
	}
	if err := e.egress(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nTry it:   curl -H 'Host: %s' %s\n", demoHost, e.cellAddr(reservedCells[0]))
	fmt.Fprintf(out, "          curl -H 'Host: %s' %s\n", reservedHost, e.cellAddr(reservedCells[1]))
	fmt.Fprintf(out, "          curl --cacert %s --resolve %s:%d:127.0.0.1 https://%s:%d/\n", relPath(e.caFile), demoHost, e.spec.httpsBase, demoHost, e.spec.httpsBase)
	fmt.Fprintf(out, "Status:   ./bin/cellvisor --config %s status -o json\n", relPath(e.cfgPath))
	fmt.Fprintf(out, "          ./bin/cellvisor --config %s status    # %s: routes per class under egress:\n", relPath(e.edge2.cli.cfg), edge2Name)
	fmt.Fprintf(out, "Control:  ./bin/cellvisor-control --admin %s --token-file %s edge list\n", e.ep.AdminURL, e.tokenRel)
	fmt.Fprintf(out, "          $CTL domain show %s; $CTL domain routing %s; $CTL pool list\n", demoHost, demoHost)
	fmt.Fprintf(out, "          $CTL egress leases --org %s; $CTL egress policy list --org %s; $CTL frontdoor list\n", demoOrg, demoOrg)
	fmt.Fprintf(out, "Edge id:  %s\n", e.edgeID)
	fmt.Fprintf(out, "Fleet:    %s%s (a browser; sign in with the admin token in %s)\n", e.ep.AdminURL, adminapi.PathFleet, e.tokenRel)
	fmt.Fprintf(out, "Metrics:  %s/metrics\n", e.ep.AdminURL)
	fmt.Fprintf(out, "Logs:     %s/%s, %s, %s\n", shortPath(e.logs.dir), controlLog, agentLog, edge2AgentLog)
	if e.o.check {
		return nil
	}
	fmt.Fprintln(out, "Running; press Ctrl-C to stop and clean up.")
	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "\nstopping: every cell is stopped and its cgroup removed; the control API's directory is removed")
		return nil
	case <-e.agent.exited:
		return fmt.Errorf("the agent exited on its own: %v", e.agent.err)
	}
}

// enroll creates the edge in the control API, enrolls the agent with its
// one-time token through `cellvisor enroll`, and publishes the sample
// domain to shared-default.
func (e *env) enroll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := e.egressPolicies(ctx); err != nil {
		return err
	}
	created, err := e.admin.CreateEdge(ctx, adminapi.EdgeRequest{Name: "demo-edge", Org: demoOrg, Country: "DE", Continent: "EU",
		MgmtIPv4: "127.0.0.1", Slots: e.cfg.Slots, EdgeUpdateRequest: adminapi.EdgeUpdateRequest{Region: ptr(regionEU)}})
	if err != nil {
		return fmt.Errorf("create edge: %w", err)
	}
	e.edgeID, e.edgeName = created.Edge.ID, created.Edge.Name
	out := e.o.out
	fmt.Fprintf(out, "\ncontrol API: edge-control %s, admin %s\n", e.ep.EdgeURL, e.ep.AdminURL)
	fmt.Fprintf(out, "created edge %s (%s, %d slots, region %s); one-time token issued\n", created.Edge.ID, created.Edge.Name, created.Edge.Slots, regionEU)
	caFile := filepath.Join(e.root, "ca.pem")
	if err := os.WriteFile(caFile, []byte(e.ep.CA), 0o644); err != nil {
		return err
	}
	enrolled, err := e.cli.run(ctx, "enroll", "--control", e.ep.EdgeURL, "--token", created.Token, "--ca-file", caFile)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "$ ./bin/cellvisor enroll --control %s --token cvt_… --ca-file %s\n%s", e.ep.EdgeURL, relPath(caFile), enrolled)
	if err := e.uploadDemoCert(ctx); err != nil {
		return err
	}
	rev, err := e.publish(ctx, demoBody)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "published %s revision %d to shared-default\n\n", demoHost, rev)
	return nil
}

// publish publishes the sample domain answering body to shared-default; it
// returns the revision.
func (e *env) publish(ctx context.Context, body string) (int64, error) {
	p, err := e.admin.Publish(ctx, demoHost, adminapi.DomainRequest{Pool: "shared-default", Config: e.demoConfig(body)})
	if err != nil {
		return 0, fmt.Errorf("publish %s: %w", demoHost, err)
	}
	e.body = body
	return p.Domain.Revision, nil
}

// demoConfig is the sample domain: body on every path but /origin/, which
// goes to the demo's origin, given by name.
func (e *env) demoConfig(body string) json.RawMessage {
	_, port, _ := net.SplitHostPort(e.originAddr)
	return json.RawMessage(fmt.Sprintf(
		`{"hostnames":[%q],"origins":[{"name":"app","url":"http://%s:%s"}],"routes":[{"prefix":"/","respond":{"status":200,"body":%q,"content_type":"text/plain"}},{"prefix":%q,"origin":"app"}],"tls":{"certificate":%q}}`,
		demoHost, originName, port, body, originRoute, demoCertName))
}

// domainConfig is a domain answering body on every path.
func domainConfig(host, body string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(
		`{"hostnames":[%q],"routes":[{"prefix":"/","respond":{"status":200,"body":%q,"content_type":"text/plain"}}]}`, host, body))
}

// awaitServing waits until cell-01 answers body for the sample domain.
func (e *env) awaitServing(ctx context.Context, body string) error {
	var got string
	err := poll(ctx, func() error {
		select {
		case <-e.agent.exited:
			return errAgentExited{e.agent.err}
		default:
		}
		var err error
		if got, err = get(ctx, e.cellURL, demoHost); err == nil && got != body {
			err = fmt.Errorf("got %q", got)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("cell-01 never served %q for %s: %w", strings.TrimSpace(body), demoHost, err)
	}
	return nil
}

type errAgentExited struct{ err error }

func (e errAgentExited) Error() string { return fmt.Sprintf("the agent exited: %v", e.err) }

// poll calls f until it succeeds, ctx ends or the agent exits. It is for
// remote state (a cell's answer, the control API's view): there is nothing
// to wait on but the answer itself.
func poll(ctx context.Context, f func() error) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		var exited errAgentExited
		if errors.As(err, &exited) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// get fetches url with the Host header host and returns the body of a 200.
func get(ctx context.Context, url, host string) (string, error) {
	code, body, err := fetch(ctx, url, host)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET %s: HTTP %d: %s", url, code, strings.TrimSpace(body))
	}
	return body, err
}

func fetch(ctx context.Context, url, host string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// findAgent is --agent, else cellvisor beside this executable.
func findAgent(flag string) (string, error) {
	if flag != "" {
		if _, err := os.Stat(flag); err != nil {
			return "", fmt.Errorf("--agent: %w", err)
		}
		return filepath.Abs(flag)
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find this executable: %w", err)
	}
	bin := filepath.Join(filepath.Dir(self), "cellvisor")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no agent binary beside the demo (%s): run make build, or pass --agent PATH", bin)
	}
	return bin, nil
}

// demoSubtree is the demo's cgroup subtree: one per demo directory, so that
// demos in other directories (and their tests) never share cell groups.
func demoSubtree(root string) string {
	sum := sha256.Sum256([]byte(root))
	return "cellvisor-demo-" + hex.EncodeToString(sum[:4])
}

func relPath(p string) string {
	if wd, err := os.Getwd(); err == nil {
		if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
	}
	return p
}

// checkCleanedUp verifies, after the agents stopped, that no cell process
// and no cell cgroup of the demo is left.
func (e *env) checkCleanedUp() error {
	var errs []error
	specs := []agentSpec{e.spec}
	if e.edge2 != nil {
		specs = append(specs, e.edge2.spec)
	}
	for _, a := range specs {
		for i := 1; i <= a.slots; i++ {
			pidFile := filepath.Join(a.dir, "run", fmt.Sprintf("cell-%02d", i), "nginx.pid")
			if v := readPidFile(pidFile); len(v) == 1 {
				if p, ok := readProc(int(v[0])); ok && strings.Contains(p.cmdline, e.root) {
					errs = append(errs, fmt.Errorf("after stop, cell-%02d's master (pid %d) of %s still runs", i, v[0], relPath(a.dir)))
				}
			}
		}
		if m, err := cgroup.New(cgroup.Options{Subtree: a.subtree}); err == nil && m.Mode() != cgroup.ModeUnenforced {
			if names, _ := m.List(); len(names) > 0 {
				errs = append(errs, fmt.Errorf("after stop, cell cgroups are left in %s: %v", a.subtree, names))
			} else if err := m.Remove(); err != nil {
				// The look itself (cgroup.New) makes the subtree again.
				errs = append(errs, fmt.Errorf("after stop, remove the cgroup subtree %s: %w", a.subtree, err))
			}
		}
	}
	return errors.Join(errs...)
}

// agentSpec is one demo agent's place: its directory (configuration,
// state, run), slots, ports, cgroup subtree, intake and region.
type agentSpec struct {
	dir       string
	slots     int
	httpBase  int
	httpsBase int
	subtree   string
	intake    int // the intake's loopback port
	region    string
	// metrics is the agent's metrics endpoint (host:port).
	metrics string
	// resolver is the DNS server its cells ask (the demo's).
	resolver string
}

// writeConfig writes a demo agent's configuration: its slots on loopback
// ports, in its own cgroup subtree, with its egress intake on loopback.
func writeConfig(a agentSpec, nginx string, modules []string, out io.Writer) (string, config.Agent, error) {
	enforce := true
	cg, err := cgroup.New(cgroup.Options{Subtree: a.subtree})
	if err == nil && cg.Mode() == cgroup.ModeUnenforced {
		fmt.Fprintf(out, "note: cell limits cannot be enforced here (%v); the demo runs cells without them\n", cg.Reason())
		enforce = false
	} else if err == nil {
		// The probe made the subtree; the agent makes it again, and
		// removes it when it stops.
		_ = cg.Remove()
	}
	var mods strings.Builder
	for _, m := range modules {
		fmt.Fprintf(&mods, "\n    - %s", m)
	}
	yaml := fmt.Sprintf(`# cellvisor demo agent configuration (written by cellvisor-demo)
state_dir: %[1]s/state
run_dir: %[1]s/run
slots: %[8]d
openresty:
  binary: %[2]s
  modules:%[3]s
  stop_timeout: 5s
  # The demo's DNS server, which answers the sample origin's name.
  resolvers: ["%[12]s"]
ports:
  address: 127.0.0.1
  http_base: %[4]d
  https_base: %[5]d
limits:
  enforce: %[6]t
cgroup:
  subtree: %[7]s
  # The demo agent shares the terminal's cgroup; under systemd it moves
  # itself into its own limited leaf.
  place_agent: false
source:
  poll_interval: 500ms
  max_backoff: 5s
  status_interval: 2s
topology:
  region: %[10]s
egress:
  # Governed egress: bundles every second, elections at least every 2s
  # (the control API's lease is 2 minutes; holders renew every 40s).
  intake_listen: 127.0.0.1:%[9]d
  interval: 1s
  max_renew: 2s
metrics:
  listen: %[11]s
log:
  format: console
  level: info
`, a.dir, nginx, mods.String(), a.httpBase, a.httpsBase, enforce, a.subtree, a.slots, a.intake, a.region, a.metrics, a.resolver)
	path := filepath.Join(a.dir, "agent.yaml")
	if err := os.MkdirAll(a.dir, 0o755); err != nil {
		return "", config.Agent{}, err
	}
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		return "", config.Agent{}, err
	}
	cfg, err := config.Load(path)
	return path, cfg, err
}
