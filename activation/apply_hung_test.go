package activation

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"cellvisor/manifest"
)

// A cell that does not answer its status calls (hung, not yet restarted by
// its liveness checks) holds back neither the other cells' reloads nor the
// ack: each call to it is bounded, the other cells load the manifest, and
// the ack is partial, naming it. Before, the survey's call to it waited as
// long as the poll's context, and every cell waited with it.
func TestHungCellDoesNotHoldBackTheOthers(t *testing.T) {
	r := newRig(t)
	r.publish(1, map[string]string{"a.example.com": "one", "q.example.com": "one"})
	if err := r.a.Poll(context.Background()); err != nil || r.a.Active() != 1 {
		t.Fatalf("first poll: %v, active %d", err, r.a.Active())
	}
	r.cells.mu.Lock()
	r.cells.hung, r.cells.reloads = "cell-02", nil
	r.cells.mu.Unlock()
	r.publish(2, map[string]string{"a.example.com": "two", "q.example.com": "two"})
	done := make(chan error, 1)
	go func() { done <- r.a.Poll(context.Background()) }() // no deadline of its own
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the poll waits on the hung cell")
	}
	r.cells.mu.Lock()
	reloads := slices.Clone(r.cells.reloads)
	r.cells.mu.Unlock()
	if !slices.Contains(reloads, "cell-01") {
		t.Errorf("reloads %v: cell-01 was not reloaded", reloads)
	}
	if a := r.lastAck(); a.Sequence != 2 || a.Status != manifest.AckPartial || !strings.Contains(strings.Join(a.Cells, ","), "cell-02") {
		t.Errorf("ack %+v, want partial naming cell-02", a)
	}
}
