package supervisor_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"cellvisor/testkit/testutil"
)

// A stalled cell that resumes takes up the agent's own calls that queued on
// its socket meanwhile, long after their callers gave up and outside their
// timestamps' window. They are correctly signed: not security events. And
// the agent queues one call at a time per cell, not one per status poll.
func TestStallIsNotAnAttack(t *testing.T) {
	const window = 1 // seconds: a stall of a few windows stands for a long one
	h := newHarness(t, harnessOpts{slots: 1, monitor: 20 * time.Millisecond, authWindow: window})
	h.waitReady("cell-01", 0)
	api := privateClient(t, h, "cell-01", nil)
	procs := cellProcs(t, h, "cell-01")
	for _, pid := range procs {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	resumed := false
	resume := func() {
		if !resumed {
			for _, pid := range procs {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
			resumed = true
		}
	}
	t.Cleanup(resume)
	// Through the stall (4 windows), the agent's monitor keeps polling the
	// stalled cell (every 20 ms, each call given up after 1 s) and eight
	// operators keep asking for live status. The agent may have no call
	// queued: if the stall caught its worker answering one, that call is
	// answered after the stall, inside its window, and none other was sent
	// meanwhile (one call in flight per cell). So a call of the same kind,
	// signed with the cell's secret, is queued here too, given up at once.
	stallEnd := time.Now().Add(4 * window * time.Second)
	qctx, qcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, _ = api.Status(qctx)
	qcancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stallEnd) {
				h.sup.LiveStatus(context.Background())
			}
		}()
	}
	wg.Wait()
	resume()

	var failures, expired int64
	testutil.Eventually(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := api.Status(ctx)
		if err != nil {
			return err
		}
		failures, expired = st.Security.AuthFailures, st.Security.Expired
		if expired == 0 {
			return fmt.Errorf("no queued call taken up yet")
		}
		return nil
	})
	if failures != 0 {
		t.Errorf("after a stall the cell counted %d security events (%d expired calls): the agent's own late calls", failures, expired)
	}
	// One call in flight at a time per client, held until the cell
	// answers: the stall queued the test's one and at most one of the
	// agent's, not one per poll and per operator.
	t.Logf("%d expired calls taken up after the stall", expired)
	if expired > 2 {
		t.Errorf("%d calls were queued on the stalled cell's socket: the agent's calls piled up", expired)
	}
	if code := readiness(t, h.slot("cell-01").HTTPPort); code != 200 {
		t.Errorf("cell-01 readiness after the stall: %d", code)
	}
}
