package main

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
)

func TestPlacementCommands(t *testing.T) {
	ep := startControl(t)
	edge := createEdge(t, ep, "fra-1")

	p := decodeJSON[adminapi.PoolView](t, mustCtl(t, ep, "pool", "create", "reserved-eu", "--replicas", "2", "--drain", "2m", "--max-conns", "100", "-o", "json"))
	if p.Replicas != 2 || p.Drain != "2m0s" || p.MaxConns != 100 || p.Bound != 500 {
		t.Errorf("pool create: %+v, want 2 replicas, drain 2m, 100 connections and the class's bound 500", p)
	}
	_, err := ctl(t, ep, "pool", "create", "shared-two", "--replicas", "2")
	wantRefused(t, err, http.StatusBadRequest, "one copy per edge")

	for _, c := range []string{"cell-03", "cell-04"} {
		out := mustCtl(t, ep, "cell", "assign", "fra-1", c, "reserved-eu")
		if !strings.Contains(out, c+" of edge "+edge.Edge.ID+" assigned to reserved-eu") {
			t.Errorf("cell assign printed %q", out)
		}
	}
	show := decodeJSON[adminapi.PoolView](t, mustCtl(t, ep, "pool", "show", "reserved-eu", "-o", "json"))
	if len(show.Edges) != 1 || !slices.Equal(show.Edges[0].Cells, []string{"cell-03", "cell-04"}) || show.Edges[0].Reported {
		t.Errorf("pool show: %+v", show.Edges)
	}
	up := decodeJSON[adminapi.PoolView](t, mustCtl(t, ep, "pool", "update", "reserved-eu", "--rate", "50", "--burst", "100", "-o", "json"))
	if up.Rate != 50 || up.Burst != 100 || up.MaxConns != 100 || len(up.Sequences) != 1 {
		t.Errorf("pool update: %+v, want the new rate, the old connections and one edge advanced", up)
	}

	file := filepath.Join(t.TempDir(), "shop.json")
	if err := os.WriteFile(file, []byte(`{"hostnames":["shop.example.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"hi\n"}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	mustCtl(t, ep, "domain", "publish", "shop.example.test", "--pool", "shared-default", "--file", file)
	m := decodeJSON[adminapi.MoveView](t, mustCtl(t, ep, "domain", "move", "shop.example.test", "--to", "reserved-eu", "-o", "json"))
	if m.State != "waiting" || m.From != "shared-default" || m.To != "reserved-eu" {
		t.Errorf("domain move: %+v", m)
	}
	d := decodeJSON[adminapi.DomainView](t, mustCtl(t, ep, "domain", "show", "shop.example.test", "-o", "json"))
	roles := map[string]string{}
	for _, p := range d.Placements {
		roles[p.Cell] = p.Role
	}
	if roles["cell-01"] != "active" || roles["cell-03"] != "target" || roles["cell-04"] != "target" || d.Move == nil {
		t.Errorf("domain show during the move: %+v", d)
	}
	// The edge never reported: no cell serves a revision of the domain.
	var cells []string
	for _, c := range d.Cells {
		cells = append(cells, c.EdgeName+"/"+c.Cell+" "+c.Role)
		if c.State != "" || c.Revision != 0 || c.Current {
			t.Errorf("domain show: %+v of an edge that never reported", c)
		}
	}
	if want := []string{"fra-1/cell-01 active", "fra-1/cell-03 target", "fra-1/cell-04 target"}; !slices.Equal(cells, want) {
		t.Errorf("domain show's cells %v, want %v", cells, want)
	}
	text := mustCtl(t, ep, "domain", "show", "shop.example.test")
	if !regexp.MustCompile(`(?m)^fra-1 +cell-03 +reserved-eu +target +unreported +none +no$`).MatchString(text) {
		t.Errorf("domain show lacks cell-03's line:\n%s", text)
	}
	// Routing never publishes the target (nothing acknowledged it), nor the
	// source here: the edge never reported its cells ready.
	if out := mustCtl(t, ep, "domain", "routing", "shop.example.test", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("routing during the move:\n%s", out)
	}
	_, err = ctl(t, ep, "cell", "unassign", "fra-1", "cell-03")
	wantRefused(t, err, http.StatusConflict, "is moving to reserved-eu")
	_, err = ctl(t, ep, "pool", "delete", "reserved-eu")
	wantRefused(t, err, http.StatusConflict, "still has")
	if out := mustCtl(t, ep, "domain", "move", "shop.example.test", "--cancel"); !strings.Contains(out, "cancelled") {
		t.Errorf("move --cancel printed %q", out)
	}
	text = mustCtl(t, ep, "domain", "show", "shop.example.test")
	for _, step := range []string{"started", "placed", "delivering", "cancelled"} {
		if !strings.Contains(text, step) {
			t.Errorf("domain show lacks the step %q:\n%s", step, text)
		}
	}
	for _, c := range []string{"cell-03", "cell-04"} {
		mustCtl(t, ep, "cell", "unassign", edge.Edge.ID, c)
	}
	if out := mustCtl(t, ep, "pool", "delete", "reserved-eu"); out != "pool reserved-eu deleted\n" {
		t.Errorf("pool delete printed %q", out)
	}
}

// wantRefused checks an admin API refusal's status and that its message
// says why.
func wantRefused(t *testing.T, err error, status int, why string) {
	t.Helper()
	var ae *adminapi.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v: want a *adminapi.Error", err)
	}
	if ae.Status != status || !strings.Contains(ae.Message, why) {
		t.Errorf("error %q (HTTP %d): want HTTP %d saying %q", ae.Message, ae.Status, status, why)
	}
}

func TestPrintDomainCells(t *testing.T) {
	now := time.Now()
	d := adminapi.DomainView{Name: "shop.example.test", Pool: "shared-default", Revision: 3, UpdatedAt: now, Cells: []adminapi.DomainCell{
		{EdgeID: "e1", EdgeName: "fra-1", Cell: "cell-01", Pool: "shared-default", Role: "active", State: "ready", Sequence: 9, Revision: 3, Current: true},
		{EdgeID: "e2", EdgeName: "fra-2", Cell: "cell-01", Pool: "shared-default", Role: "active", State: "degraded", Sequence: 7, Revision: 2},
		{EdgeID: "e3", Cell: "cell-02", Pool: "shared-default", Role: "leaving"},
	}}
	var out strings.Builder
	if err := printDomain(&out, d, now); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		`EDGE +CELL +POOL +ROLE +STATE +REVISION +CURRENT`,
		`fra-1 +cell-01 +shared-default +active +ready +3 +yes`,
		`fra-2 +cell-01 +shared-default +active +degraded +2 +no`,
		`e3 +cell-02 +shared-default +leaving +unreported +none +no`,
	} {
		if !regexp.MustCompile(`(?m)^` + line + `$`).MatchString(out.String()) {
			t.Errorf("domain show lacks a line %q:\n%s", line, out.String())
		}
	}
}
