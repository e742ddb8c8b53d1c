package controlapi_test

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"cellvisor/edgeapi"
)

// A report cannot be "unchanged" while changing what the control plane
// reads: a status whose keys repeat reads differently as a map (the last
// value wins, which the digest saw) and as the Summary every reader decodes
// (objects merge), so the digest covers the Summary as read too.
func TestStatusDigestCoversWhatIsRead(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	edge := e.createEdge(t, "a")
	c, _, _ := e.enroll(t, edge.Token)
	report := func(seq string) {
		t.Helper()
		// "slots" twice: a map keeps the second list, the Summary decodes
		// it into the first one's elements and keeps their sequence.
		st := `{"version":"t",` +
			`"slots":[{"name":"cell-01","pool":"shared-default","state":"ready","sequence":` + seq + `},` +
			`{"name":"cell-01","pool":"shared-default","state":"ready","sequence":` + seq + `}],` +
			`"slots":[{"name":"cell-01"},{"name":"cell-01"}]}`
		if err := c.Report(ctx(t), edgeapi.StatusReport{At: time.Now().UTC(), Status: json.RawMessage(st)}); err != nil {
			t.Fatal(err)
		}
	}
	report("1")
	report("2")
	v, err := e.admin.Edge(ctx(t), edge.Edge.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Cells) == 0 || v.Cells[0].Sequence != 2 {
		t.Errorf("edge show: cells %+v, want cell-01 at sequence 2 (the second report was taken as unchanged)", v.Cells)
	}
}
