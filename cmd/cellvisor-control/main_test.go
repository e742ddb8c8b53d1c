package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
)

// startControl runs the real control API on loopback with a SQLite store in
// a temporary directory, and points the admin commands' token at it.
func startControl(t *testing.T) controlapi.Endpoints {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan controlapi.Endpoints, 1)
	done := make(chan error, 1)
	go func() {
		done <- controlapi.Serve(ctx, controlapi.Config{Data: dir, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0"},
			func(ep controlapi.Endpoints) { ready <- ep })
	}()
	// Registered after t.TempDir, so it runs first: Serve is done with the
	// directory before it is removed.
	t.Cleanup(func() {
		cancel()
		wait, stop := context.WithTimeout(context.Background(), 30*time.Second)
		defer stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-wait.Done():
			t.Error("serve did not return within 30s of cancellation")
		}
	})
	wait, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	var ep controlapi.Endpoints
	select {
	case ep = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-wait.Done():
		t.Fatal("control API not ready within 30s")
	}
	t.Setenv("CELLVISOR_ADMIN_TOKEN", ep.AdminToken)
	return ep
}

// ctl runs the command line args with --admin after the command's words
// (flags may follow them) and returns what it printed.
func ctl(t *testing.T, ep controlapi.Endpoints, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, append(args, "--admin", ep.AdminURL), strings.NewReader(""), &out, io.Discard)
	return out.String(), err
}

// mustCtl is ctl for a command that must succeed.
func mustCtl(t *testing.T, ep controlapi.Endpoints, args ...string) string {
	t.Helper()
	out, err := ctl(t, ep, args...)
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	return out
}

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return v
}

func createEdge(t *testing.T, ep controlapi.Endpoints, name string) adminapi.CreatedEdge {
	t.Helper()
	return decodeJSON[adminapi.CreatedEdge](t, mustCtl(t, ep, "edge", "create", "--name", name, "--org", "acme",
		"--country", "de", "--continent", "eu", "--slots", "4", "-o", "json"))
}

// wantAdminError checks err is the admin API's refusal with status and a
// message naming field.
func wantAdminError(t *testing.T, err error, status int, field string) {
	t.Helper()
	var ae *adminapi.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v: want a *adminapi.Error", err)
	}
	if ae.Status != status || !strings.HasPrefix(ae.Message, field+":") {
		t.Errorf("error %q (HTTP %d): want HTTP %d naming %s", ae.Message, ae.Status, status, field)
	}
}

func TestEdgeCreateListShow(t *testing.T) {
	ep := startControl(t)
	out := mustCtl(t, ep, "edge", "create", "--name", "fra-1", "--org", "acme", "--country", "DE", "--continent", "EU",
		"--mgmt-ipv4", "192.0.2.10", "--control-url", "https://control.example.test:8443")

	edges := decodeJSON[[]adminapi.EdgeView](t, mustCtl(t, ep, "edge", "list", "-o", "json"))
	if len(edges) != 1 {
		t.Fatalf("edge list: %d edges, want 1", len(edges))
	}
	e := edges[0]
	if e.Name != "fra-1" || e.Enrollment != adminapi.EnrollmentPending || e.Slots != adminapi.DefaultSlots || e.MgmtIPv4 != "192.0.2.10" {
		t.Errorf("edge list: %+v, want fra-1, pending, %d slots, 192.0.2.10", e, adminapi.DefaultSlots)
	}
	var token string
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "token: "); ok {
			token = v
		}
	}
	for _, want := range []string{"id:    " + e.ID + "\n", "shown once and never again",
		"cellvisor enroll --control https://control.example.test:8443 --token " + token + " --ca-file ca.pem\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("edge create printed:\n%s\nwant it to contain %q", out, want)
		}
	}
	if !strings.HasPrefix(token, "cvt_") {
		t.Errorf("edge create: token %q, want cvt_…", token)
	}

	table := mustCtl(t, ep, "edge", "list")
	if lines := strings.Split(strings.TrimSpace(table), "\n"); len(lines) != 2 ||
		!strings.Contains(lines[1], e.ID) || !strings.Contains(lines[1], "pending") || !strings.Contains(lines[1], "never") {
		t.Errorf("edge list table:\n%s\nwant a header and fra-1 pending, never seen", table)
	}

	shown := decodeJSON[adminapi.EdgeView](t, mustCtl(t, ep, "edge", "show", e.ID, "-o", "json"))
	if shown.ID != e.ID || shown.Assignments["cell-01"] != "shared-default" {
		t.Errorf("edge show: %+v, want %s with cell-01 in shared-default", shown, e.ID)
	}
	text := mustCtl(t, ep, "edge", "show", e.ID)
	for _, want := range []string{"edge fra-1 (" + e.ID + ")\n", "org acme, DE/EU, 8 slots, management 192.0.2.10\n",
		"enrollment: pending, 0 rotation(s), last seen never\n", "manifests: sequence 1, active (acked) 0\n",
		"assignments: cell-01 shared-default, cell-02 quarantine-default\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("edge show printed:\n%s\nwant it to contain %q", text, want)
		}
	}

	rotated := mustCtl(t, ep, "edge", "rotate", e.ID)
	if !strings.Contains(rotated, "token: cvt_") || strings.Contains(rotated, token) {
		t.Errorf("edge rotate printed:\n%s\nwant a new token", rotated)
	}

	if deleted := decodeJSON[adminapi.EdgeView](t, mustCtl(t, ep, "edge", "delete", e.ID)); deleted.ID != e.ID {
		t.Errorf("edge delete printed %+v", deleted)
	}
	if left := decodeJSON[[]adminapi.EdgeView](t, mustCtl(t, ep, "edge", "list", "-o", "json")); len(left) != 0 {
		t.Errorf("edges after the delete: %+v", left)
	}
	_, err := ctl(t, ep, "edge", "delete", e.ID)
	wantAdminError(t, err, http.StatusNotFound, "edge "+e.ID)
}

func TestEdgeCreateRefused(t *testing.T) {
	ep := startControl(t)
	_, err := ctl(t, ep, "edge", "create", "--name", "x", "--org", "acme", "--country", "XX", "--continent", "EU")
	wantAdminError(t, err, http.StatusBadRequest, "country")
	edges := decodeJSON[[]adminapi.EdgeView](t, mustCtl(t, ep, "edge", "list", "-o", "json"))
	if len(edges) != 0 {
		t.Errorf("edge list after a refused create: %d edges, want 0", len(edges))
	}
}

func TestToken(t *testing.T) {
	ep := startControl(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	missing := filepath.Join(t.TempDir(), "admin.token")

	t.Setenv("CELLVISOR_ADMIN_TOKEN", "")
	err := run(ctx, []string{"--admin", ep.AdminURL, "--token-file", missing, "edge", "list"}, nil, io.Discard, io.Discard)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "admin token") {
		t.Errorf("edge list without a token: %v, want a missing admin token", err)
	}

	if err := os.WriteFile(missing, []byte(ep.AdminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, []string{"--admin", ep.AdminURL, "--token-file", missing, "edge", "list"}, nil, io.Discard, io.Discard); err != nil {
		t.Errorf("edge list with the token file: %v", err)
	}

	t.Setenv("CELLVISOR_ADMIN_TOKEN", "cva_not-the-admin-token")
	err = run(ctx, []string{"--admin", ep.AdminURL, "--token-file", missing, "edge", "list"}, nil, io.Discard, io.Discard)
	var ae *adminapi.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Errorf("edge list with a wrong CELLVISOR_ADMIN_TOKEN: %v, want HTTP 401 (the variable wins over the file)", err)
	}
	if err == nil || !strings.Contains(err.Error(), "rejected the admin token from $CELLVISOR_ADMIN_TOKEN") || strings.Contains(err.Error(), "required") {
		t.Errorf("edge list with a wrong token: %v, want it called rejected, not required", err)
	}
	t.Setenv("CELLVISOR_ADMIN_TOKEN", "")
	if err := os.WriteFile(missing, []byte("cva_wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = run(ctx, []string{"edge", "list", "--token-file", missing, "--admin", ep.AdminURL}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "rejected the admin token from "+missing) {
		t.Errorf("edge list with a wrong token file: %v, want it rejected, naming the file", err)
	}
}

func TestDomainPublish(t *testing.T) {
	ep := startControl(t)
	edge := createEdge(t, ep, "fra-1")
	file := filepath.Join(t.TempDir(), "shop.json")
	config := `{"hostnames":["shop.example.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"hi\n"}}]}`
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	last := int64(0)
	for rev := int64(1); rev <= 2; rev++ {
		p := decodeJSON[adminapi.PublishedView](t, mustCtl(t, ep, "domain", "publish", "shop.example.test",
			"--pool", "shared-default", "--file", file, "-o", "json"))
		if p.Domain.Revision != rev || p.Domain.Pool != "shared-default" || p.EdgesPending != 1 || len(p.Edges) != 0 || p.Publish <= last {
			t.Errorf("publish %d: %+v, want revision %d fanned out (after %d) to 1 edge", rev, p, rev, last)
		}
		last = p.Publish
	}
	// Sequence 1 is the edge's first manifest, empty: its next poll builds
	// the publishes into its sequence 2.
	shown := decodeJSON[adminapi.EdgeView](t, mustCtl(t, ep, "edge", "show", edge.Edge.ID, "-o", "json"))
	if shown.Sequence != 1 {
		t.Errorf("edge show after two publishes, before a poll: sequence %d, want 1", shown.Sequence)
	}
	ds := decodeJSON[[]adminapi.DomainView](t, mustCtl(t, ep, "domain", "list", "-o", "json"))
	if len(ds) != 1 || ds[0].Name != "shop.example.test" || ds[0].Revision != 2 {
		t.Errorf("domain list: %+v, want shop.example.test at revision 2", ds)
	}
	if table := mustCtl(t, ep, "domain", "list"); !strings.Contains(table, "shop.example.test") {
		t.Errorf("domain list table:\n%s\nwant shop.example.test", table)
	}

	text := mustCtl(t, ep, "domain", "publish", "shop.example.test", "--pool", "shared-default", "--file", file)
	want := "published shop.example.test revision 3 to shared-default ("
	if !strings.HasPrefix(text, want) || !strings.Contains(text, " bytes, sha256 ") ||
		!strings.Contains(text, ": 1 edge(s) hold the domain; each builds its new manifest at its next poll\n") {
		t.Errorf("domain publish printed:\n%s\nwant %q… and the edges that build it", text, want)
	}

	_, err := ctl(t, ep, "domain", "publish", "shop.example.test", "--pool", "bogus", "--file", file)
	wantAdminError(t, err, http.StatusBadRequest, "pool")

	deleted := decodeJSON[adminapi.PublishedView](t, mustCtl(t, ep, "domain", "delete", "shop.example.test"))
	if deleted.EdgesPending != 1 || deleted.Publish <= last {
		t.Errorf("domain delete: %+v, want it fanned out to 1 edge", deleted)
	}
}

func TestTask(t *testing.T) {
	ep := startControl(t)
	edge := createEdge(t, ep, "fra-1")
	_, err := ctl(t, ep, "task", "create", edge.Edge.ID, "cell-01", "explode")
	wantAdminError(t, err, http.StatusBadRequest, "action")

	task := decodeJSON[adminapi.TaskView](t, mustCtl(t, ep, "task", "create", edge.Edge.ID, "cell-02", "drain", "-o", "json"))
	if task.EdgeID != edge.Edge.ID || task.Cell != "cell-02" || task.Action != "drain" || task.ID == 0 {
		t.Errorf("task create: %+v, want drain cell-02 of %s", task, edge.Edge.ID)
	}
	text := mustCtl(t, ep, "task", "create", edge.Edge.ID, "cell-02", "undrain")
	if want := fmt.Sprintf("task %d created: undrain cell-02 of edge %s, ", task.ID+1, edge.Edge.ID); !strings.HasPrefix(text, want) {
		t.Errorf("task create printed %q, want %q…", text, want)
	}
	table := mustCtl(t, ep, "task", "list", edge.Edge.ID)
	if lines := strings.Split(strings.TrimSpace(table), "\n"); len(lines) != 3 ||
		!strings.Contains(lines[1], "cell-02") || !strings.Contains(lines[1], "drain") {
		t.Errorf("task list:\n%s\nwant a header, the drain and the undrain of cell-02", table)
	}
}

func TestCA(t *testing.T) {
	ep := startControl(t)
	out := mustCtl(t, ep, "ca")
	block, _ := pem.Decode([]byte(out))
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("ca printed %q, want a PEM certificate", out)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !cert.IsCA {
		t.Errorf("ca: certificate %s is not a CA", cert.Subject)
	}
	if out != ep.CA {
		t.Error("ca printed another certificate than the control API's CA")
	}
}

func TestPool(t *testing.T) {
	ep := startControl(t)
	if out := mustCtl(t, ep, "pool", "create", "reserved-gold"); !strings.HasPrefix(out, "pool reserved-gold created (class reserved)\n") {
		t.Errorf("pool create printed %q", out)
	}
	pools := decodeJSON[[]adminapi.PoolView](t, mustCtl(t, ep, "pool", "list", "-o", "json"))
	found := false
	for _, p := range pools {
		found = found || p.Name == "reserved-gold" && p.Class == "reserved"
	}
	if !found {
		t.Errorf("pool list: %+v, want reserved-gold (reserved)", pools)
	}
	if table := mustCtl(t, ep, "pool", "list"); !strings.Contains(table, "reserved-gold") {
		t.Errorf("pool list table:\n%s\nwant reserved-gold", table)
	}
	_, err := ctl(t, ep, "pool", "create", "gold")
	wantAdminError(t, err, http.StatusBadRequest, "name")
}

func TestUsageErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Setenv("CELLVISOR_ADMIN_TOKEN", "cva_0123456789abcdef")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "no command given"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate" for "cellvisor-control"`},
		{"unknown subcommand", []string{"edge", "explode"}, `unknown command "explode" for "cellvisor-control edge"`},
		{"group without subcommand", []string{"task"}, "cellvisor-control task needs one"},
		{"flag of another command", []string{"edge", "list", "--pool", "p"}, `unknown flag --pool for "cellvisor-control edge list": it belongs to "cellvisor-control domain publish"`},
		{"unknown flag", []string{"ca", "--bogus"}, `unknown flag --bogus for "cellvisor-control ca": see cellvisor-control ca --help`},
		{"publish without file", []string{"domain", "publish", "x.test", "--pool", "p"}, "--file is required"},
		{"missing argument", []string{"edge", "show"}, "usage: cellvisor-control edge show ID"},
		{"extra argument", []string{"ca", "now"}, "usage: cellvisor-control ca"},
		{"bad output format", []string{"edge", "list", "-o", "yaml"}, `unknown output format "yaml"`},
		{"bad admin URL", []string{"--admin", "127.0.0.1:8442", "edge", "list"}, "want http://HOST:PORT"},
		{"bad log format", []string{"serve", "--log-format", "xml"}, `log format "xml"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Unknown commands print the usage on stderr: not captured here.
			err := run(ctx, tc.args, nil, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run %q: %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	for _, tc := range []struct {
		name string
		t    *time.Time
		want string
	}{
		{"never", nil, "never"},
		{"zero", &time.Time{}, "never"},
		{"clock skew", at(-5 * time.Second), "just now"},
		{"seconds", at(3*time.Second + 400*time.Millisecond), "3s ago"},
		{"minutes", at(5*time.Minute + 59*time.Second), "5m ago"},
		{"hours", at(47 * time.Hour), "47h ago"},
		{"days", at(72 * time.Hour), "3d ago"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := age(tc.t, now); got != tc.want {
				t.Errorf("age = %q, want %q", got, tc.want)
			}
		})
	}
}

// --help, -h and help [COMMAND] print the usage on stdout and succeed.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "Available Commands:"},
		{[]string{"-h"}, "--token-file string"},
		{[]string{"help"}, "Available Commands:"},
		{[]string{"help", "edge", "show"}, "cellvisor-control edge show ID"},
		{[]string{"edge", "--help"}, "create      create an edge"},
		{[]string{"domain", "publish", "-h"}, "--file string"},
		{[]string{"serve", "--help"}, "--admin-listen string"},
		{[]string{"task", "create", "x", "--help"}, "drain, undrain or restart one cell"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tc.args, nil, &stdout, &stderr)
			if err != nil || stderr.Len() != 0 || !strings.Contains(stdout.String(), "Usage:") || !strings.Contains(stdout.String(), tc.want) {
				t.Errorf("cellvisor-control %q: %v, stderr %q, stdout:\n%s\nwant the usage with %q on stdout", tc.args, err, stderr.String(), stdout.String(), tc.want)
			}
		})
	}
}

// The admin flags work before, between and after the command's words.
func TestGlobalFlagsAnywhere(t *testing.T) {
	ep := startControl(t)
	edge := createEdge(t, ep, "fra-1")
	for _, args := range [][]string{
		{"--admin", ep.AdminURL, "edge", "show", edge.Edge.ID, "-o", "json"},
		{"edge", "--admin", ep.AdminURL, "show", edge.Edge.ID, "-o", "json"},
		{"edge", "show", "--admin=" + ep.AdminURL, edge.Edge.ID, "-o", "json"},
		{"edge", "show", edge.Edge.ID, "-o", "json", "--admin", ep.AdminURL},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), args, nil, &out, io.Discard); err != nil {
			t.Errorf("cellvisor-control %q: %v", args, err)
			continue
		}
		if v := decodeJSON[adminapi.EdgeView](t, out.String()); v.ID != edge.Edge.ID {
			t.Errorf("cellvisor-control %q: edge %s, want %s", args, v.ID, edge.Edge.ID)
		}
	}
}
