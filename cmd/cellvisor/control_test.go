package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"cellvisor/agent"
	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/manifest"
	"cellvisor/runtime"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// control is a real control API in this test process, on SQLite, that can
// be stopped and started again on the same address with the same data.
type control struct {
	t      *testing.T
	data   string
	listen string
	ep     controlapi.Endpoints
	admin  *adminapi.Client
	stop   func()
}

func startControl(t *testing.T, data, listen string, opts ...func(*controlapi.Config)) *control {
	t.Helper()
	cfg := controlapi.Config{Data: data, Listen: listen, AdminListen: "127.0.0.1:0", Logger: zap.NewNop()}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan controlapi.Endpoints, 1)
	done := make(chan error, 1)
	go func() {
		done <- controlapi.Serve(ctx, cfg, func(ep controlapi.Endpoints) { ready <- ep })
	}()
	c := &control{t: t, data: data}
	stopped := false
	c.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("control API: %v", err)
			}
		}
	}
	t.Cleanup(c.stop)
	select {
	case c.ep = <-ready:
	case err := <-done:
		t.Fatalf("control API: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("control API not ready in 30s")
	}
	c.listen = strings.TrimPrefix(c.ep.EdgeURL, "https://")
	c.admin = &adminapi.Client{URL: c.ep.AdminURL, Token: c.ep.AdminToken}
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (c *control) publish(t testing.TB, body string) adminapi.PublishedView {
	t.Helper()
	p, err := c.admin.Publish(ctxT(t), "app.test", adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(
		fmt.Sprintf(`{"hostnames":["app.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":%q}}]}`, body))})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// awaitEdge waits until the control API's view of the edge satisfies ok.
func (c *control) awaitEdge(t *testing.T, id string, what string, ok func(adminapi.EdgeView) bool) adminapi.EdgeView {
	t.Helper()
	var v adminapi.EdgeView
	testutil.Eventually(t, 30*time.Second, func() error {
		var err error
		if v, err = c.admin.Edge(ctxT(t), id); err != nil {
			return err
		}
		if !ok(v) {
			return fmt.Errorf("edge: want %s; sequence %d active %d cells %+v", what, v.Sequence, v.ActiveSequence, v.Cells)
		}
		return nil
	})
	return v
}

func runCLI(t testing.TB, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

// The main job, through the real binaries: enroll with a one-time token,
// get published revisions to the cell with acks, run a drain task from the
// admin API, and keep serving through a control API outage, then catch up.
func TestEnrolledAgentEndToEnd(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	cfgPath, cfg := agentConfig(t, 2, "source:\n  poll_interval: 100ms\n  max_backoff: 400ms\n  status_interval: 200ms\n")
	created, err := c.admin.CreateEdge(ctxT(t), adminapi.EdgeRequest{Name: "e2e", Org: "acme", Country: "NL", Continent: "EU", Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caFile, []byte(c.ep.CA), 0o644)

	out, err := runCLI(t, bin, "--config", cfgPath, "enroll", "--control", c.ep.EdgeURL, "--token", created.Token, "--ca-file", caFile)
	if err != nil || !strings.Contains(out, "enrolled as edge "+created.Edge.ID) {
		t.Fatalf("enroll: %v\n%s", err, out)
	}
	for _, f := range []string{"key.pem", "cert.pem", "ca.pem", "server-ca.pem"} {
		if st, err := os.Stat(filepath.Join(cfg.IdentityDir(), f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("identity file %s: %v %v", f, st, err)
		}
	}
	if out, err := runCLI(t, bin, "--config", cfgPath, "enroll", "--control", c.ep.EdgeURL, "--token", created.Token, "--ca-file", caFile); err == nil || !strings.Contains(out, "already enrolled") {
		t.Fatalf("second enroll: %v\n%s", err, out)
	}

	c.publish(t, "v1")
	a, st := startAgent(t, bin, cfgPath, cfg)
	port := st.Slots[0].HTTPPort
	awaitBody(t, port, "v1")
	// Sequence 1 is the edge's first manifest, empty; v1 is sequence 2.
	c.awaitEdge(t, created.Edge.ID, "sequence 2 acknowledged", func(v adminapi.EdgeView) bool { return v.ActiveSequence == 2 })
	out, err = runCLI(t, bin, "--config", cfgPath, "status")
	if err != nil || !strings.Contains(out, "enrolled as "+created.Edge.ID) {
		t.Fatalf("status: %v\n%s", err, out)
	}

	// A new revision reaches the cell and is acknowledged.
	if p := c.publish(t, "v2"); p.EdgesPending != 1 {
		t.Fatalf("publish v2: %+v", p)
	}
	awaitBody(t, port, "v2")
	v3 := c.awaitEdge(t, created.Edge.ID, "sequence 3 acknowledged", func(v adminapi.EdgeView) bool { return v.ActiveSequence == 3 })
	// Its ack says which runtime each running cell runs (issue 41).
	if len(v3.Acks) == 0 || v3.Acks[0].Sequence != 3 || len(v3.Acks[0].Runtimes) != 2 {
		t.Fatalf("acks %+v, want sequence 3's first, with both cells' runtimes", v3.Acks)
	}
	for i, r := range v3.Acks[0].Runtimes {
		if r.Cell != fmt.Sprintf("cell-%02d", i+1) || !strings.Contains(r.Version, "/") || r.Superseded {
			t.Errorf("ack runtime %+v, want cell-%02d on the host's binary's version, not superseded", r, i+1)
		}
	}

	// A drain task created in the admin API drains the cell.
	task, err := c.admin.CreateTask(ctxT(t), created.Edge.ID, adminapi.TaskRequest{Cell: "cell-01", Action: "drain"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if s := mustStatus(t, cfg).Slots[0]; s.State != supervisor.StateDrained {
			return fmt.Errorf("cell-01 is %s", s.State)
		}
		return nil
	})
	v := c.awaitEdge(t, created.Edge.ID, "the drain task done and the drained cell reported", func(v adminapi.EdgeView) bool {
		return len(v.Tasks) == 1 && v.Tasks[0].State == "done" && len(v.Cells) == 2 && v.Cells[0].State == "drained"
	})
	if v.Tasks[0].ID != task.ID || v.Tasks[0].Result != "drained" {
		t.Fatalf("task %+v", v.Tasks[0])
	}
	if _, err := c.admin.CreateTask(ctxT(t), created.Edge.ID, adminapi.TaskRequest{Cell: "cell-01", Action: "undrain"}); err != nil {
		t.Fatal(err)
	}
	c.awaitEdge(t, created.Edge.ID, "cell-01 ready again", func(v adminapi.EdgeView) bool { return len(v.Cells) == 2 && v.Cells[0].State == "ready" })

	// The control API goes away: the cell keeps serving, the agent says why
	// in status; it comes back (same address, same database) with a new
	// revision, and the agent catches up.
	c.stop()
	testutil.Eventually(t, 30*time.Second, func() error {
		if ctl := mustStatus(t, cfg).Control; ctl == nil || ctl.LastPollError == "" {
			return fmt.Errorf("no poll error in status yet")
		}
		return nil
	})
	if got, err := appBody(port); err != nil || got != "v2" {
		t.Fatalf("during the outage the cell answers %q, %v", got, err)
	}
	c = startControl(t, c.data, c.listen)
	c.publish(t, "v3")
	awaitBody(t, port, "v3")
	c.awaitEdge(t, created.Edge.ID, "sequence 4 acknowledged", func(v adminapi.EdgeView) bool { return v.ActiveSequence == 4 })
	if ctl := mustStatus(t, cfg).Control; ctl.Enrollment != agent.EnrollmentEnrolled || ctl.EdgeID != created.Edge.ID || ctl.LastSuccess == nil {
		t.Fatalf("control status %+v", ctl)
	}
	acks, _ := c.admin.Edge(ctxT(t), created.Edge.ID)
	for _, ack := range acks.Acks {
		if ack.Status != manifest.AckApplied {
			t.Errorf("ack %+v", ack)
		}
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit %d", code)
	}

	// The identity survives a restart: no token, the same edge, and the
	// revision published while the agent was down arrives.
	c.publish(t, "v4")
	a, _ = startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, port, "v4")
	c.awaitEdge(t, created.Edge.ID, "sequence 5 acknowledged", func(v adminapi.EdgeView) bool { return v.ActiveSequence == 5 })
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit %d", code)
	}

	// An enrolled edge refuses a local domains_dir, before it writes anything.
	local, _ := os.ReadFile(cfgPath)
	localPath := filepath.Join(t.TempDir(), "local.yaml")
	os.WriteFile(localPath, append(local, []byte("domains_dir: "+filepath.Join(filepath.Dir(cfgPath), "domains")+"\n")...), 0o644)
	out, err = runCLI(t, bin, "--config", localPath, "run")
	if err == nil || !strings.Contains(out, "domains_dir: this edge is enrolled") {
		t.Fatalf("run with domains_dir on an enrolled edge: %v\n%s", err, out)
	}
	topo := runtime.Plan(runtime.Layout{Slots: 2, HTTPBase: cfg.Ports.HTTPBase, HTTPSBase: cfg.Ports.HTTPSBase, StateDir: cfg.StateDir, RunDir: cfg.RunDir})
	if cur, err := runtime.Current(topo.Slots[0]); err != nil || cur.Sequence != 5 {
		t.Fatalf("after the refused start cell-01's release is %+v, %v; want sequence 5", cur, err)
	}

	// Damaged identity files do not take the cells down: they serve their
	// releases from disk, and status says why nothing is polled.
	if err := os.WriteFile(filepath.Join(cfg.IdentityDir(), "cert.pem"), []byte("damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, _ = startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, port, "v4")
	if ctl := mustStatus(t, cfg).Control; ctl.Enrollment != agent.EnrollmentUnusable || !strings.Contains(ctl.Error, "client certificate") {
		t.Fatalf("control status with a damaged certificate: %+v", ctl)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit %d", code)
	}
}

// enroll creates an edge with req and enrolls the agent of cfgPath with the
// built binary's enroll command (the control API's CA pinned by file).
func (c *control) enroll(t testing.TB, bin, cfgPath string, req adminapi.EdgeRequest) adminapi.CreatedEdge {
	t.Helper()
	created, err := c.admin.CreateEdge(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, []byte(c.ep.CA), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, bin, "--config", cfgPath, "enroll", "--control", c.ep.EdgeURL, "--token", created.Token, "--ca-file", caFile); err != nil {
		t.Fatalf("enroll %s: %v\n%s", req.Name, err, out)
	}
	return created
}
