package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/manifest"
)

// edge show says the edge's runtime and its roll, each cell's runtime and
// each ack's runtimes, agent text made printable.
func TestPrintEdgeRuntimes(t *testing.T) {
	now := time.Date(2026, 12, 7, 23, 0, 0, 0, time.UTC)
	e := adminapi.EdgeView{ID: "e1", Name: "edge-1", Slots: 2,
		Runtime: &adminapi.RuntimeView{Version: "nginx/1.22.2", Superseded: 1, Upgrade: "waiting", Reason: "runtime_upgrade is manual\r\nforged line"},
		Cells: []adminapi.CellView{{Name: "cell-01", Pool: "shared-default", State: "ready", RuntimeVersion: "nginx/1.22.1", RuntimeSuperseded: true},
			{Name: "cell-02", Pool: "shared-default", State: "ready", RuntimeVersion: "nginx/1.22.2"}},
		StatusAt: &now,
		Acks: []manifest.Ack{{Sequence: 3, Status: manifest.AckApplied, At: now,
			Runtimes: []manifest.CellRuntime{{Cell: "cell-01", Version: "nginx/1.22.1", Superseded: true}, {Cell: "cell-02"}}}},
	}
	var b bytes.Buffer
	if err := printEdge(&b, e, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"runtime: nginx/1.22.2, 1 cell(s) on a superseded runtime, upgrade waiting: runtime_upgrade is manual",
		"nginx/1.22.1 (superseded)",
		"cell-01 nginx/1.22.1 (superseded), cell-02 unknown",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("edge show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\nforged line") {
		t.Errorf("an agent's reason forged a line of output:\n%s", out)
	}
}
