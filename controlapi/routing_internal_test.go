package controlapi

import (
	"slices"
	"testing"

	"cellvisor/controlapi/store"
)

func TestRouted(t *testing.T) {
	cell := func(name, role, state string, revision int64) servedCell {
		return servedCell{Placed: store.Placed{Cell: name, Role: role}, report: cellReport{State: state}, revision: revision}
	}
	const current = 3
	for _, tc := range []struct {
		name  string
		cells []servedCell
		want  []string
	}{
		{"only the cells at the current revision",
			[]servedCell{cell("cell-01", "active", "ready", 3), cell("cell-02", "active", "ready", 2)}, []string{"cell-01"}},
		{"earlier revisions while none is current",
			[]servedCell{cell("cell-01", "active", "ready", 2), cell("cell-02", "active", "ready", 1), cell("cell-03", "active", "ready", 0)},
			[]string{"cell-01", "cell-02"}},
		{"a current cell not ready does not hide the earlier ones",
			[]servedCell{cell("cell-01", "active", "starting", 3), cell("cell-02", "active", "ready", 2)}, []string{"cell-02"}},
		{"a current target cell does not hide the earlier active ones",
			[]servedCell{cell("cell-01", "target", "ready", 3), cell("cell-02", "active", "ready", 2)}, []string{"cell-02"}},
		{"a cell that serves no revision: never",
			[]servedCell{cell("cell-01", "active", "ready", 0)}, nil},
		{"not ready, or not reported: never",
			[]servedCell{cell("cell-01", "active", "degraded", 3), cell("cell-02", "active", "", 3)}, nil},
		{"leaving and target cells: never",
			[]servedCell{cell("cell-01", "leaving", "ready", 3), cell("cell-02", "target", "ready", 2)}, nil},
		{"a rollback: a lower current revision, a higher earlier one",
			[]servedCell{cell("cell-01", "active", "ready", 4), cell("cell-02", "active", "ready", 3)}, []string{"cell-02"}},
	} {
		var got []string
		for _, c := range routed(tc.cells, current) {
			got = append(got, c.Cell)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: routed %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestCellReports(t *testing.T) {
	got := cellReports([]byte(`{"slots":[{"name":"cell-01","state":"ready","sequence":7,"http_port":8001},{"name":"cell-02","state":"stopped"}]}`))
	if got["cell-01"] != (cellReport{State: "ready", Sequence: 7, Port: 8001}) || got["cell-02"] != (cellReport{State: "stopped"}) || len(got) != 2 {
		t.Errorf("cell reports %+v", got)
	}
	for _, status := range []string{"", "{", `{"slots":{}}`} {
		if got := cellReports([]byte(status)); got != nil {
			t.Errorf("status %q: cell reports %+v, want none", status, got)
		}
	}
}
