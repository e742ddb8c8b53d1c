package supervisor_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/runtime"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// An assigned slot that has never had a release reads waiting while a
// manifest source is to deliver one (a freshly enrolled edge before its
// first manifest), not degraded: nothing is wrong yet. Without a source
// nothing will come, and it stays degraded (runtime missing). Before, a
// fresh edge showed its cells degraded (issue 39).
func TestFreshSlotWaitsForItsFirstRelease(t *testing.T) {
	h := layoutHarness(t, harnessOpts{slots: 2, assign: runtime.Assignments{"cell-01": domain.PoolSharedDefault}})
	h.opts.Assignments = runtime.Assignments{"cell-01": domain.PoolSharedDefault, "cell-02": domain.PoolSharedDefault}
	sup, err := supervisor.New(h.opts)
	if err != nil {
		t.Fatal(err)
	}
	h.sup = sup
	h.sup.ExpectReleases()
	h.start()
	h.waitReady("cell-01", 0)
	want := func(st supervisor.State, reason string) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() error {
			s := h.slot("cell-02")
			if s.State != st || !strings.Contains(s.Reason, reason) {
				return fmt.Errorf("cell-02 %s (%s), want %s (%s)", s.State, s.Reason, st, reason)
			}
			return nil
		})
	}
	want(supervisor.StateWaiting, "waiting for its first release")
	h.restart() // a supervisor with no manifest source
	want(supervisor.StateDegraded, "runtime missing")
}
