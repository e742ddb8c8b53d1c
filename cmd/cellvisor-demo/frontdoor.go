package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cellvisor/cellapi"
	"cellvisor/controlapi/adminapi"
)

// The demo edge's front door, and URLs the resolver must refuse.
const (
	demoFrontDoor = "https://shop.demo.example"
	// demoResolve is how a visitor might spell it: case, trailing dot,
	// explicit default port, a path.
	demoResolve  = "HTTPS://Shop.Demo.Example.:443/checkout"
	demoUnmapped = "https://elsewhere.demo.example"
	// The second edge's front door, and how a visitor spells it.
	edge2FrontDoor = "https://api.demo.example"
	edge2Resolve   = "https://API.demo.example/v1/orders"
	demoMalformed  = "https://user@shop.demo.example"
)

// frontDoor sets both edges' front doors, prints two resolves that answer
// different edges and a refusal, and (with --check) checks them in the
// control API and in the first edge's cell-01, which resolves through the
// agent's runtime file (the org's front doors, the second edge's too).
func (e *env) frontDoor(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkWait)
	defer cancel()
	out := e.o.out
	v, err := e.admin.SetFrontDoor(ctx, e.edgeID, adminapi.FrontDoorRequest{URL: demoFrontDoor})
	if err != nil {
		return fmt.Errorf("set the front door: %w", err)
	}
	fmt.Fprintf(out, "\n$ $CTL frontdoor set %s %s\nfront door of edge %s (%s): %s\n", e.edgeID, demoFrontDoor, v.EdgeID, v.Service, v.URL)
	r, err := e.admin.Resolve(ctx, demoResolve, "")
	if err != nil {
		return fmt.Errorf("resolve %s: %w", demoResolve, err)
	}
	fmt.Fprintf(out, "$ $CTL frontdoor resolve '%s'\n%s -> edge %s (org %s, front door %s)\n", demoResolve, r.URL, r.EdgeID, r.Org, r.Canonical)
	v2, err := e.admin.SetFrontDoor(ctx, e.edge2.id, adminapi.FrontDoorRequest{URL: edge2FrontDoor})
	if err != nil {
		return fmt.Errorf("set the second edge's front door: %w", err)
	}
	fmt.Fprintf(out, "$ $CTL frontdoor set %s %s\nfront door of edge %s (%s): %s\n", e.edge2.id, edge2FrontDoor, v2.EdgeID, v2.Service, v2.URL)
	r2, err := e.admin.Resolve(ctx, edge2Resolve, "")
	if err != nil {
		return fmt.Errorf("resolve %s: %w", edge2Resolve, err)
	}
	fmt.Fprintf(out, "$ $CTL frontdoor resolve '%s'\n%s -> edge %s (org %s, front door %s)\n", edge2Resolve, r2.URL, r2.EdgeID, r2.Org, r2.Canonical)
	_, uerr := e.admin.Resolve(ctx, demoUnmapped, "")
	var ae *adminapi.Error
	if errors.As(uerr, &ae) {
		fmt.Fprintf(out, "$ $CTL frontdoor resolve %s\nrefused (%s): %s\n", demoUnmapped, ae.Reason, ae.Message)
	}
	if !e.o.check {
		return nil
	}
	if r.EdgeID != e.edgeID || r.Canonical != "https://shop.demo.example:443" {
		return fmt.Errorf("check: %s resolved to %+v, want edge %s", demoResolve, r, e.edgeID)
	}
	if r2.EdgeID != e.edge2.id || r2.Canonical != "https://api.demo.example:443" {
		return fmt.Errorf("check: %s resolved to %+v, want edge %s", edge2Resolve, r2, e.edge2.id)
	}
	if ae == nil || ae.Reason != "unmapped" {
		return fmt.Errorf("check: %s: %v, want an unmapped refusal", demoUnmapped, uerr)
	}
	if _, err := e.admin.Resolve(ctx, demoMalformed, ""); !errors.As(err, &ae) || ae.Reason != "malformed" {
		return fmt.Errorf("check: %s: %v, want a malformed refusal", demoMalformed, err)
	}
	// The cell resolves it too, once the agent fetched the front doors.
	err = poll(ctx, func() error {
		for _, c := range []struct{ url, edge string }{{demoResolve, e.edgeID}, {edge2Resolve, e.edge2.id}} {
			edge, reason, err := e.cellResolve(ctx, "cell-01", c.url)
			if err == nil && edge != c.edge {
				err = fmt.Errorf("cell-01 resolves %s to %q (%s), want %s", c.url, edge, reason, c.edge)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if edge, reason, err := e.cellResolve(ctx, "cell-01", demoUnmapped); err != nil || edge != "" || reason != "unmapped" {
		return fmt.Errorf("check: cell-01 resolves %s: %q %q %v, want unmapped", demoUnmapped, edge, reason, err)
	}
	fmt.Fprintf(out, "check: cell-01 resolves %s to edge %s, %s to edge %s, and refuses %s (unmapped)\n",
		demoResolve, e.edgeID, edge2Resolve, e.edge2.id, demoUnmapped)
	return nil
}

// cellResolve asks a cell, on its private socket with its secret, to
// resolve u against the org's front doors.
func (e *env) cellResolve(ctx context.Context, cell, u string) (edge, reason string, err error) {
	secret, err := os.ReadFile(filepath.Join(e.cfg.StateDir, "cells", cell, "secret"))
	if err != nil {
		return "", "", err
	}
	c := cellapi.New(filepath.Join(e.cfg.RunDir, cell, "private.sock"), []byte(strings.TrimSpace(string(secret))))
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if edge, reason, err = c.FrontDoor(ctx, u); err != nil {
		return "", "", fmt.Errorf("%s: %w", cell, err)
	}
	return edge, reason, nil
}
