package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cellvisor/agent"
	"cellvisor/cgroup"
	"cellvisor/config"
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
	cfgPath, cfg, err := writeDemoFiles(root)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg.Log)
	if err != nil {
		return err
	}
	a, err := agent.New(cfg, log)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()

	err = demoSteps(ctx, a, cfgPath, *check)
	stop()
	if rerr := <-done; rerr != nil {
		err = errors.Join(err, rerr)
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

func demoSteps(ctx context.Context, a *agent.Agent, cfgPath string, check bool) error {
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case <-a.Ready():
	case <-wait.Done():
		return fmt.Errorf("demo: cells not ready: %w", wait.Err())
	}
	st := a.Status()
	fmt.Println()
	printStatus(os.Stdout, st)
	if st.Slots[0].State != supervisor.StateReady {
		return fmt.Errorf("demo: cell-01 is %s: %s", st.Slots[0].State, st.Slots[0].Reason)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", st.Slots[0].HTTPPort)
	body, err := demoGet(ctx, url)
	if err != nil {
		return err
	}
	fmt.Printf("\n$ curl -H 'Host: %s' %s\n%s", demoHost, url, body)
	if body != demoBody {
		return fmt.Errorf("demo: cell-01 answered %q, want %q", body, demoBody)
	}
	fmt.Printf("\nTry it:   curl -H 'Host: %s' %s\n", demoHost, url)
	fmt.Printf("Status:   ./bin/cellvisor --config %s status -o json\n", relPath(cfgPath))
	if check {
		return nil
	}
	fmt.Println("Running; press Ctrl-C to stop and clean up.")
	<-ctx.Done()
	fmt.Println("\nstopping: every cell is stopped and its cgroup removed")
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
	domains := filepath.Join(root, "domains")
	if err := os.MkdirAll(domains, 0o755); err != nil {
		return "", config.Agent{}, err
	}
	domain := fmt.Sprintf(`{
  "domain": %q,
  "pool": "shared-default",
  "revision": 1,
  "hostnames": [%q],
  "routes": [{"prefix": "/", "respond": {"status": 200, "body": %q, "content_type": "text/plain"}}]
}
`, demoHost, demoHost, demoBody)
	if err := os.WriteFile(filepath.Join(domains, "demo.json"), []byte(domain), 0o644); err != nil {
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
domains_dir: %[1]s/domains
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
