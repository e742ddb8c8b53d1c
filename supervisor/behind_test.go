package supervisor_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/agent"
	"cellvisor/domain"
	"cellvisor/runtime"
	"cellvisor/supervisor"
)

// switchRelease activates release seq of the harness's test domain on
// name, answering body: the cell is to serve it.
func switchRelease(t *testing.T, h *harness, name string, seq int64, body string) {
	t.Helper()
	s := h.slotSpec(name)
	pools, err := runtime.CompilePools([]domain.Domain{
		{Domain: testHost, Pool: domain.PoolSharedDefault, Revision: seq, Hostnames: []string{testHost},
			Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: body}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.BuildRelease(agent.RenderParams(h.cfg, s, domain.PoolSharedDefault, seq), pools[domain.PoolSharedDefault])
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runtime.Activate(s, r); err != nil {
		t.Fatal(err)
	}
}

// A cell whose reload does not take effect (its master stopped: the SIGHUP
// waits, the workers serve on) reports the release it serves, not the one
// switched in; past the grace it is degraded with both sequences as its
// reason, and past the restart bound it is restarted and serves the
// switched release.
func TestCellBehindItsReleaseIsDegradedThenRestarted(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, liveness: supervisor.LivenessPolicy{
		Interval: 100 * time.Millisecond, Timeout: time.Second, BehindGrace: 500 * time.Millisecond, BehindRestart: 2 * time.Second}})
	st := h.waitReady("cell-01", 0)
	if st.Sequence != 1 || st.CurrentSequence != 1 {
		t.Fatalf("ready: sequence %d, current %d; want 1, 1 (asked of the cell once it answered)", st.Sequence, st.CurrentSequence)
	}

	signal(t, syscall.SIGSTOP, st.PID)
	switchRelease(t, h, "cell-01", 2, "two")
	if err := h.sup.Reload("cell-01"); err != nil {
		t.Fatal(err)
	}
	if now := h.slot("cell-01"); now.Sequence != 1 || now.CurrentSequence != 2 {
		t.Errorf("after the reload was sent: sequence %d, current %d; want 1 (what the cell serves), 2", now.Sequence, now.CurrentSequence)
	}
	behind := h.waitFor("cell-01", 20*time.Second, "degraded: serving 1, current 2", func(s supervisor.SlotStatus) bool {
		return s.State == supervisor.StateDegraded && strings.Contains(s.Reason, "serving sequence 1, current 2")
	})
	if behind.PID != st.PID || behind.Sequence != 1 {
		t.Errorf("behind: pid %d (was %d), sequence %d; want the same master, serving 1", behind.PID, st.PID, behind.Sequence)
	}
	if code, body, err := get(behind.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
		t.Errorf("while behind the cell answers %d %q %v; want release 1's 200 %q", code, body, err, "hello")
	}
	restarted := h.waitFor("cell-01", 30*time.Second, "restarted, ready on release 2", func(s supervisor.SlotStatus) bool {
		return s.PID != st.PID && s.State == supervisor.StateReady && s.Sequence == 2
	})
	if restarted.CurrentSequence != 2 || !strings.Contains(restarted.LastExit, "serving sequence 1, current 2") {
		t.Errorf("after the restart: current %d, last exit %q; want 2, the reason", restarted.CurrentSequence, restarted.LastExit)
	}
	if code, body, err := get(restarted.HTTPPort, "/"); err != nil || code != 200 || body != "two" {
		t.Errorf("after the restart the cell answers %d %q %v; want 200 %q", code, body, err, "two")
	}
}
