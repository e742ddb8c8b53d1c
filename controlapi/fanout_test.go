package controlapi_test

import (
	"errors"
	"path/filepath"
	"testing"

	"cellvisor/controlapi/adminapi"
	"cellvisor/manifest"
)

// builds counts the manifest builds done by result (advanced, unchanged).
func builds(t *testing.T, e *env, result string) uint64 {
	t.Helper()
	fams, err := e.srv.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "cellvisor_control_manifest_builds_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, map[string]string{"result": result}) {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

// A publish answers before any edge's manifest is built: the poll of an
// edge holding the domain builds its new sequence, once, and an edge
// without a cell of the pool is answered from the cache, building nothing.
func TestPublishIsBuiltAtThePoll(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	a, q := e.createEdge(t, "a"), e.createEdge(t, "q")
	ca, ida, _ := e.enroll(t, a.Token)
	cq, _, _ := e.enroll(t, q.Token)
	zero := 0
	if _, err := e.admin.CreatePoolWith(ctx(t), adminapi.PoolRequest{Name: "reserved-eu", MinReady: &zero}); err != nil {
		t.Fatal(err)
	}
	as, err := e.admin.AssignCell(ctx(t), a.Edge.ID, "cell-03", "reserved-eu")
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Collect(ctx(t), ca.Page, ida.EdgeID, 0)
	if err != nil || m.Sequence != as.Sequence {
		t.Fatalf("before the publish: sequence %d, %v; want %d", m.Sequence, err, as.Sequence)
	}
	p, err := e.admin.Publish(ctx(t), "eu.example.test", adminapi.DomainRequest{Pool: "reserved-eu",
		Config: []byte(`{"hostnames":["eu.example.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"eu"}}]}`)})
	if err != nil || p.EdgesPending != 1 || len(p.Edges) != 0 {
		t.Fatalf("publish: %+v, %v", p, err)
	}
	if v, _ := e.admin.Edge(ctx(t), a.Edge.ID); v.Sequence != as.Sequence {
		t.Fatalf("edge a at sequence %d before its poll, want %d", v.Sequence, as.Sequence)
	}
	// The edge outside the pool: nothing new, nothing built.
	if _, err := cq.Page(ctx(t), 1, ""); !errors.Is(err, manifest.ErrNoChange) {
		t.Fatalf("poll of the edge outside the pool: %v", err)
	}
	if n := builds(t, e, "advanced") + builds(t, e, "unchanged"); n != 0 {
		t.Fatalf("%d builds before the edge holding the domain polled", n)
	}
	m, err = manifest.Collect(ctx(t), ca.Page, ida.EdgeID, m.Sequence)
	if err != nil || m.Sequence != as.Sequence+1 || len(m.Entries) != 1 || m.Entries[0].Domain != "eu.example.test" {
		t.Fatalf("after the publish: %+v, %v", m, err)
	}
	if n := builds(t, e, "advanced"); n != 1 {
		t.Fatalf("%d builds advanced, want 1", n)
	}
	// Polled again at its new sequence: the cache answers, nothing built.
	if _, err := ca.Page(ctx(t), m.Sequence, ""); !errors.Is(err, manifest.ErrNoChange) {
		t.Fatalf("poll at the new sequence: %v", err)
	}
	if n := builds(t, e, "advanced") + builds(t, e, "unchanged"); n != 1 {
		t.Fatalf("%d builds after polling again, want still 1", n)
	}
	if v, _ := e.admin.Edge(ctx(t), a.Edge.ID); v.Sequence != m.Sequence {
		t.Fatalf("edge show: sequence %d, want %d", v.Sequence, m.Sequence)
	}
}
