package main

import (
	"net/http"
	"strings"
	"testing"

	"cellvisor/controlapi/adminapi"
)

func TestEgressCommands(t *testing.T) {
	ep := startControl(t)
	ce := decodeJSON[adminapi.CreatedEdge](t, mustCtl(t, ep, "edge", "create", "--name", "fra-1", "--org", "acme", "--country", "DE",
		"--continent", "EU", "--region", "eu-central", "--zone", "eu-central-1a", "--weight", "7", "-o", "json"))
	if e := ce.Edge; e.Region != "eu-central" || e.Zone != "eu-central-1a" || e.Weight != 7 || e.Priority != 100 || e.CostTier != 0 {
		t.Errorf("edge create with topology: %+v", e)
	}
	out := mustCtl(t, ep, "edge", "update", ce.Edge.ID, "--priority", "10", "--cost-tier", "2")
	if want := "edge fra-1: region eu-central, zone eu-central-1a, priority 10, cost tier 2, weight 7"; !strings.Contains(out, want) {
		t.Errorf("edge update printed %q, want %q", out, want)
	}
	if out := mustCtl(t, ep, "edge", "show", ce.Edge.ID); !strings.Contains(out, "region eu-central, zone eu-central-1a; egress ranking: priority 10, cost tier 2, weight 7") {
		t.Errorf("edge show:\n%s", out)
	}
	if out := mustCtl(t, ep, "edge", "list"); !strings.Contains(out, "REGION") || !strings.Contains(out, "eu-central-1a") {
		t.Errorf("edge list:\n%s", out)
	}
	_, err := ctl(t, ep, "edge", "update", ce.Edge.ID, "--weight", "70000")
	wantRefused(t, err, http.StatusBadRequest, "weight")

	out = mustCtl(t, ep, "egress", "policy", "set", "acme", "metering", "--destination", "https://ingest.example.net/m", "--region", "eu-central",
		"--require-zone", "eu-central-1a")
	if want := "egress policy acme/metering: destination https://ingest.example.net/m, preferred region eu-central, required region -, required zone eu-central-1a"; !strings.Contains(out, want) {
		t.Errorf("policy set printed %q", out)
	}
	p := decodeJSON[adminapi.EgressPolicyView](t, mustCtl(t, ep, "egress", "policy", "show", "acme", "metering", "-o", "json"))
	if p.Destination != "https://ingest.example.net/m" || p.Require.Zone != "eu-central-1a" {
		t.Errorf("policy show: %+v", p)
	}
	if out := mustCtl(t, ep, "egress", "policy", "list", "--org", "acme"); !strings.Contains(out, "metering") || !strings.Contains(out, "https://ingest.example.net/m") {
		t.Errorf("policy list:\n%s", out)
	}
	_, err = ctl(t, ep, "egress", "policy", "set", "acme", "telemetry", "--destination", "https://x/")
	wantRefused(t, err, http.StatusBadRequest, "unknown traffic class")
	_, err = ctl(t, ep, "egress", "policy", "set", "acme", "license", "--destination", "file:///etc/passwd")
	wantRefused(t, err, http.StatusBadRequest, "destination")
	if out := mustCtl(t, ep, "egress", "policy", "clear", "acme", "metering"); !strings.Contains(out, "cleared") {
		t.Errorf("policy clear printed %q", out)
	}
	_, err = ctl(t, ep, "egress", "policy", "show", "acme", "metering")
	wantRefused(t, err, http.StatusNotFound, "not found")
	if out := mustCtl(t, ep, "egress", "leases"); !strings.HasPrefix(out, "ORG") || strings.Count(out, "\n") != 1 {
		t.Errorf("leases with none:\n%s", out)
	}
}
