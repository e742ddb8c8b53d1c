package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"cellvisor/agent"
	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/controlapi"
	"cellvisor/controlclient"
	"cellvisor/runtime"
	"cellvisor/supervisor"
)

const (
	demoHost     = "demo.cellvisor.test"
	demoHTTPBase = 18080
	demoBody     = "hello from cellvisor: demo.cellvisor.test served by cell-01 (shared-default)\n"
)

func cmdDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	dir := fs.String("dir", ".demo", "directory for the demo's files")
	check := fs.Bool("check", false, "run the scenario non-interactively and exit 0 only if every step worked")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	// Every run is a new edge of a new control plane: no identity, topology
	// or release of an earlier run is kept.
	for _, d := range []string{"state", "run"} {
		if err := os.RemoveAll(filepath.Join(root, d)); err != nil {
			return err
		}
	}
	cfgPath, cfg, err := writeDemoFiles(root)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg.Log)
	if err != nil {
		return err
	}
	data, err := os.MkdirTemp("", "cellvisor-control-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)

	// 1. The control API, on SQLite in a temporary directory.
	ctlCtx, stopCtl := context.WithCancel(ctx)
	defer stopCtl()
	ready := make(chan controlapi.Endpoints, 1)
	ctlDone := make(chan error, 1)
	go func() {
		ctlDone <- controlapi.Serve(ctlCtx, controlapi.Config{Data: data, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", Logger: log.Named("cellvisor-control")},
			func(ep controlapi.Endpoints) { ready <- ep })
	}()
	var ep controlapi.Endpoints
	select {
	case ep = <-ready:
	case err := <-ctlDone:
		return fmt.Errorf("demo: control API: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	stopControl := func() error {
		stopCtl()
		return <-ctlDone
	}
	a, err := demoEnroll(ctx, root, ep, cfg, log)
	if err != nil {
		return errors.Join(err, stopControl())
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()

	err = demoSteps(ctx, a, ep, cfgPath, filepath.Join(data, "admin.token"), *check)
	stop()
	if rerr := <-done; rerr != nil {
		err = errors.Join(err, rerr)
	}
	if cerr := stopControl(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return err
	}
	if *check {
		if err := checkCleanedUp(a.Status()); err != nil {
			return err
		}
		fmt.Println("demo check: every step worked")
	}
	return nil
}

// demoEnroll creates the edge in the control API, enrolls this agent with
// its one-time token, publishes the sample domain to shared-default, and
// prepares the agent.
func demoEnroll(ctx context.Context, root string, ep controlapi.Endpoints, cfg config.Agent, log *zap.Logger) (*agent.Agent, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	admin := &controlapi.AdminClient{URL: ep.AdminURL, Token: ep.AdminToken}
	created, err := admin.CreateEdge(ctx, controlapi.EdgeRequest{Name: "demo-edge", Org: "demo", Country: "DE", Continent: "EU", MgmtIPv4: "192.0.2.10", Slots: cfg.Slots})
	if err != nil {
		return nil, fmt.Errorf("demo: create edge: %w", err)
	}
	fmt.Printf("\ncontrol API: edge-control %s, admin %s\n", ep.EdgeURL, ep.AdminURL)
	fmt.Printf("created edge %s (%s, %d slots); one-time token issued\n", created.Edge.ID, created.Edge.Name, created.Edge.Slots)
	caFile := filepath.Join(root, "ca.pem")
	if err := os.WriteFile(caFile, []byte(ep.CA), 0o644); err != nil {
		return nil, err
	}
	id, err := controlclient.Enroll(ctx, controlclient.EnrollOptions{URL: ep.EdgeURL, Token: created.Token, CAFile: caFile,
		Dir: cfg.IdentityDir(), IdentityFile: cfg.Identity(), Slots: cfg.Slots})
	if err != nil {
		return nil, fmt.Errorf("demo: enroll: %w", err)
	}
	fmt.Printf("enrolled: client certificate CN=%s, identity in %s\n", id.EdgeID, relPath(cfg.IdentityDir()))
	p, err := admin.Publish(ctx, demoHost, controlapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(fmt.Sprintf(
		`{"hostnames":[%q],"routes":[{"prefix":"/","respond":{"status":200,"body":%q,"content_type":"text/plain"}}]}`, demoHost, demoBody))})
	if err != nil {
		return nil, fmt.Errorf("demo: publish: %w", err)
	}
	fmt.Printf("published %s revision %d to shared-default: edge manifest sequence %d\n\n", demoHost, p.Domain.Revision, p.Edges[id.EdgeID])
	a, err := agent.New(cfg, log)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	return a, nil
}

func demoSteps(ctx context.Context, a *agent.Agent, ep controlapi.Endpoints, cfgPath, tokenFile string, check bool) error {
	wait, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	select {
	case <-a.Ready():
	case <-wait.Done():
		return fmt.Errorf("demo: cells not ready: %w", wait.Err())
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", a.Status().Slots[0].HTTPPort)
	// The first poll fetches, verifies and activates the manifest: wait for
	// cell-01 to serve it and for the control API to have its ack.
	var body string
	var err error
	for {
		body, err = demoGet(wait, url)
		if err == nil && body == demoBody {
			break
		}
		if wait.Err() != nil {
			return fmt.Errorf("demo: cell-01 never served %s (last: %q, %v)", demoHost, body, err)
		}
		time.Sleep(100 * time.Millisecond) // polling a remote answer: nothing to wait on
	}
	admin := &controlapi.AdminClient{URL: ep.AdminURL, Token: ep.AdminToken}
	var view controlapi.EdgeView
	for {
		edges, err := admin.Edges(wait)
		if err == nil && len(edges) == 1 && edges[0].ActiveSequence >= 1 {
			view = edges[0]
			break
		}
		if wait.Err() != nil {
			return fmt.Errorf("demo: the control API never got the edge's ack: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	st := a.Status()
	printStatus(os.Stdout, st)
	if st.Slots[0].State != supervisor.StateReady {
		return fmt.Errorf("demo: cell-01 is %s: %s", st.Slots[0].State, st.Slots[0].Reason)
	}
	fmt.Printf("\n$ curl -H 'Host: %s' %s\n%s", demoHost, url, body)
	fmt.Printf("\ncontrol API says: edge %s %s, sequence %d, active (acked) %d\n", view.Name, view.Enrollment, view.Sequence, view.ActiveSequence)
	fmt.Printf("\nTry it:   curl -H 'Host: %s' %s\n", demoHost, url)
	fmt.Printf("Status:   ./bin/cellvisor --config %s status -o json\n", relPath(cfgPath))
	fmt.Printf("Control:  ./bin/cellvisor-control --admin %s --token-file %s edge list\n", ep.AdminURL, tokenFile)
	if check {
		return nil
	}
	fmt.Println("Running; press Ctrl-C to stop and clean up.")
	<-ctx.Done()
	fmt.Println("\nstopping: every cell is stopped and its cgroup removed; the control API's temporary directory is removed")
	return nil
}

func demoGet(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	req.Host = demoHost
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("demo: GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("demo: GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), nil
}

// checkCleanedUp verifies, after the agent stopped, that no cell process is
// left: every slot stopped, and no master pid is still alive.
func checkCleanedUp(st supervisor.Status) error {
	for _, s := range st.Slots {
		if s.State != supervisor.StateStopped || s.PID != 0 {
			return fmt.Errorf("demo: after stop %s is %s with pid %d", s.Name, s.State, s.PID)
		}
	}
	return nil
}

func relPath(p string) string {
	if wd, err := os.Getwd(); err == nil {
		if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
	}
	return p
}

// writeDemoFiles lays out the demo directory: a sample domain and an agent
// configuration with 8 slots on loopback ports.
func writeDemoFiles(root string) (string, config.Agent, error) {
	bin, modules, err := runtime.FindOpenResty()
	if err != nil {
		return "", config.Agent{}, fmt.Errorf("demo: %w (run: make deps)", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", config.Agent{}, err
	}
	enforce := true
	cg, err := cgroup.New(cgroup.Options{Subtree: "cellvisor-demo"})
	if err == nil && cg.Mode() == cgroup.ModeUnenforced {
		fmt.Printf("note: cell limits cannot be enforced here (%v); the demo runs cells without them\n", cg.Reason())
		enforce = false
	}
	var mods strings.Builder
	for _, m := range modules {
		fmt.Fprintf(&mods, "\n    - %s", m)
	}
	yaml := fmt.Sprintf(`# cellvisor demo agent configuration (written by cellvisor demo)
state_dir: %[1]s/state
run_dir: %[1]s/run
slots: 8
openresty:
  binary: %[2]s
  modules:%[3]s
  stop_timeout: 5s
ports:
  address: 127.0.0.1
  http_base: %[4]d
  https_base: %[5]d
limits:
  enforce: %[6]t
cgroup:
  subtree: cellvisor-demo
  # The demo agent shares the terminal's cgroup; under systemd it moves
  # itself into its own limited leaf.
  place_agent: false
source:
  poll_interval: 500ms
  max_backoff: 5s
  status_interval: 2s
log:
  format: console
  level: info
`, root, bin, mods.String(), demoHTTPBase, demoHTTPBase+363, enforce)
	path := filepath.Join(root, "agent.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		return "", config.Agent{}, err
	}
	cfg, err := config.Load(path)
	return path, cfg, err
}
