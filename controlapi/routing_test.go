package controlapi_test

import (
	"fmt"
	"slices"
	"testing"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
)

// routedAt is the routing view of a domain as edge/cell@revision.
func routedAt(t *testing.T, e *env, domain string) []string {
	t.Helper()
	return routeList(t, e, domain, func(r adminapi.Route) string { return fmt.Sprintf("%s/%s@%d", r.EdgeName, r.Cell, r.Revision) })
}

// servedBy is domain show's cells of a domain as
// edge/cell role state sequence revision current.
func servedBy(t *testing.T, e *env, domain string) []string {
	t.Helper()
	d, err := e.admin.Domain(ctx(t), domain)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range d.Cells {
		out = append(out, fmt.Sprintf("%s/%s %s %q %d %d %t", c.EdgeName, c.Cell, c.Role, c.State, c.Sequence, c.Revision, c.Current))
	}
	return out
}

// TestRoutingFollowsAppliedRevisions checks that the routing view lists a
// cell only once it applied the domain, prefers the cells that applied its
// current revision, keeps the earlier revision's cells while none has,
// and that domain show says what each cell serves.
func TestRoutingFollowsAppliedRevisions(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		const shop = "shop.example.test"
		a, b := e.createEdge(t, "a"), e.createEdge(t, "b")
		ca, ida, _ := e.enroll(t, a.Token)
		cb, idb, _ := e.enroll(t, b.Token)
		// Both cells ready at their first manifest, which has no domain.
		first := collect(t, ca, ida).Sequence
		applyAndReport(t, ca, first, "cell-01")
		publish(t, e, shop, "v1")
		if got := routedAt(t, e, shop); len(got) != 0 {
			t.Fatalf("routing of a domain no cell applied: %v (a ready cell at a sequence before it would answer 404)", got)
		}
		want := []string{fmt.Sprintf("a/cell-01 active \"ready\" %d 0 false", first), "b/cell-01 active \"\" 0 0 false"}
		if got := servedBy(t, e, shop); !slices.Equal(got, want) {
			t.Fatalf("domain show before any cell applied it:\n%v\nwant\n%v", got, want)
		}

		v1 := reportNewest(t, ca, ida)
		if got := routedAt(t, e, shop); !slices.Equal(got, []string{"a/cell-01@1"}) {
			t.Fatalf("routing once a applied revision 1: %v", got)
		}
		b1 := reportNewest(t, cb, idb)
		if got := routedAt(t, e, shop); !slices.Equal(got, []string{"a/cell-01@1", "b/cell-01@1"}) {
			t.Fatalf("routing once both applied revision 1: %v", got)
		}

		// A second publish, not built or applied yet: the cells at revision
		// 1 stay listed rather than none.
		publish(t, e, shop, "v2")
		if got := routedAt(t, e, shop); !slices.Equal(got, []string{"a/cell-01@1", "b/cell-01@1"}) {
			t.Fatalf("routing while no cell has revision 2: %v", got)
		}
		v2 := reportNewest(t, ca, ida)
		if v2 <= v1 {
			t.Fatalf("edge a's sequence after the second publish: %d, before %d", v2, v1)
		}
		if got := routedAt(t, e, shop); !slices.Equal(got, []string{"a/cell-01@2"}) {
			t.Fatalf("routing once a applied revision 2: %v (b still serves 1)", got)
		}
		want = []string{fmt.Sprintf("a/cell-01 active \"ready\" %d 2 true", v2), fmt.Sprintf("b/cell-01 active \"ready\" %d 1 false", b1)}
		if got := servedBy(t, e, shop); !slices.Equal(got, want) {
			t.Fatalf("domain show with a on revision 2:\n%v\nwant\n%v", got, want)
		}
		// The cell at revision 2 not ready: b at revision 1 serves again.
		applyAndReport(t, ca, v2, "cell-01!")
		if got := routedAt(t, e, shop); !slices.Equal(got, []string{"b/cell-01@1"}) {
			t.Fatalf("routing with the only cell at revision 2 not ready: %v", got)
		}
		applyAndReport(t, ca, v2, "cell-01")
		reportNewest(t, cb, idb)
		if got := routedAt(t, e, shop); !slices.Equal(got, []string{"a/cell-01@2", "b/cell-01@2"}) {
			t.Fatalf("routing once both applied revision 2: %v", got)
		}
	})
}

// reportNewest collects the edge's newest manifest and reports its cell-01
// ready at it, returning the sequence.
func reportNewest(t *testing.T, c *controlclient.Client, id controlclient.Identity) int64 {
	t.Helper()
	seq := collect(t, c, id).Sequence
	applyAndReport(t, c, seq, "cell-01")
	return seq
}
