package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cellvisor/agent"
	"cellvisor/cellapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/testkit/testutil"
)

// cellResolve asks a running cell, on its private socket, to resolve u
// against its org's front doors.
func cellResolve(t *testing.T, runDir, stateDir, cell, u string) (edge, reason string, err error) {
	t.Helper()
	secret, err := os.ReadFile(filepath.Join(stateDir, "cells", cell, "secret"))
	if err != nil {
		return "", "", err
	}
	c := cellapi.New(filepath.Join(runDir, cell, "private.sock"), []byte(strings.TrimSpace(string(secret))))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.FrontDoor(ctx, u)
}

// The front door end to end: an operator sets it in the control API, the
// agent's status reports refresh the gateway rows (topology, health) and
// keep it, the agent fetches the org's front doors into its runtime file,
// and a real cell resolves URLs through it, refusing what is not mapped.
func TestFrontDoorResolvedByTheCells(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	cfgPath, cfg := agentConfig(t, 1, "source:\n  poll_interval: 100ms\n  max_backoff: 400ms\n  status_interval: 200ms\n"+
		"topology:\n  region: eu-central\n  zone: eu-central-1a\n  locality: fra\n")
	created := c.enroll(t, bin, cfgPath, adminapi.EdgeRequest{Name: "fd", Org: "acme", Country: "DE", Continent: "EU", Slots: 1})
	id := created.Edge.ID
	if _, err := c.admin.SetFrontDoor(ctxT(t), id, adminapi.FrontDoorRequest{URL: "https://shop.acme.example"}); err != nil {
		t.Fatal(err)
	}
	c.publish(t, "v1")
	startAgent(t, bin, cfgPath, cfg)

	testutil.Eventually(t, 30*time.Second, func() error {
		fds, err := c.admin.FrontDoors(ctxT(t), "acme")
		if err != nil {
			return err
		}
		if len(fds) != 1 || fds[0].Region != "eu-central" || fds[0].Zone != "eu-central-1a" || !fds[0].Healthy || fds[0].Port != cfg.Ports.HTTPSBase {
			return fmt.Errorf("gateway rows not refreshed yet: %+v", fds)
		}
		if fds[0].URL != "https://shop.acme.example:443" || fds[0].EdgeID != id {
			t.Fatalf("the sync changed the front door: %+v", fds[0])
		}
		return nil
	})
	testutil.Eventually(t, 30*time.Second, func() error {
		edge, reason, err := cellResolve(t, cfg.RunDir, cfg.StateDir, "cell-01", "HTTPS://Shop.Acme.Example./checkout")
		if err != nil {
			return err
		}
		if edge != id {
			return fmt.Errorf("cell resolves to %q (%s), want %s", edge, reason, id)
		}
		return nil
	})
	// Long URLs (over nginx's default 8 KB request line once in the
	// query) are refused with the resolver's reason, not by nginx with an
	// HTML 414.
	// One of 4 KB that escapes to 12 KB reaches the cell's resolver; one
	// of 12 KB is refused before it is sent.
	escaped := "https://shop.acme.example/" + strings.Repeat("é", 2<<10)
	long := "https://shop.acme.example/" + strings.Repeat("x", 12<<10)
	for u, want := range map[string]string{"https://other.acme.example": "unmapped", "https://user@shop.acme.example": "malformed", escaped: "malformed", long: "malformed"} {
		if edge, reason, err := cellResolve(t, cfg.RunDir, cfg.StateDir, "cell-01", u); err != nil || edge != "" || reason != want {
			t.Errorf("cell resolve %.60s: %q %q %v, want %s", u, edge, reason, err, want)
		}
	}
	st := mustStatus(t, cfg)
	if fd := st.Control.FrontDoors; fd == nil || fd.Rows != 1 || fd.Error != "" || fd.LastFetch == nil {
		t.Fatalf("front doors in status: %+v", fd)
	}

	// Cleared: the agent's next fetch empties the file and the cell refuses.
	if err := c.admin.ClearFrontDoor(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		_, reason, err := cellResolve(t, cfg.RunDir, cfg.StateDir, "cell-01", "https://shop.acme.example")
		if err != nil {
			return err
		}
		if reason != "unmapped" {
			return fmt.Errorf("after clear the cell answers %q", reason)
		}
		return nil
	})
	data, err := os.ReadFile(agent.FrontDoorFile(cfg.StateDir))
	if err != nil || !strings.Contains(string(data), `"rows":[]`) {
		t.Fatalf("runtime file after clear: %s, %v", data, err)
	}
}
