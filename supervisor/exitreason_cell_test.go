package supervisor_test

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// A cell that cannot start says why: its exit reason quotes the master's
// [error] line (init_by_lua error: ... too short), not only "exit status
// 1". Before, exitreason.go read emerg, alert and crit lines only (issue
// 39).
func TestExitReasonQuotesTheMastersError(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1})
	st := h.waitReady("cell-01", 0)
	if err := os.WriteFile(h.slotSpec("cell-01").SecretFile(), []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil { // the master the harness's supervisor started
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		s := h.slot("cell-01")
		if s.State == supervisor.StateReady || !strings.Contains(s.LastExit, "init_by_lua error") || !strings.Contains(s.LastExit, "too short") {
			return fmt.Errorf("cell-01 %s, last exit %q", s.State, s.LastExit)
		}
		return nil
	})
	t.Logf("last exit: %s", h.slot("cell-01").LastExit)
}
