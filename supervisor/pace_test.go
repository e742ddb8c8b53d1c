package supervisor_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// pacedAfterFirst replaces the binary under a harness of two cells with the
// paced policy and a pace of an hour, and waits until the first cell runs
// the new binary while the roll waits out the pace: it returns both cells
// as they were before, and the first as it is now.
func pacedAfterFirst(t *testing.T) (h *harness, before []supervisor.SlotStatus, first supervisor.SlotStatus) {
	t.Helper()
	bin := copyBinary(t)
	h = newHarness(t, harnessOpts{slots: 2, assign: allAssigned(2), binary: bin, upgrade: supervisor.UpgradePaced, pace: time.Hour})
	before = []supervisor.SlotStatus{h.waitReady("cell-01", 0), h.waitReady("cell-02", 0)}
	original, _ := testutil.RequireOpenResty(t)
	installBinary(t, original, bin)
	testutil.Eventually(t, 60*time.Second, func() error {
		r := h.sup.Status().Runtime
		if r.Upgrade != supervisor.UpgradeRolling || !strings.Contains(r.Reason, "paced: cell-01 rolled; cell-02 next at") {
			return fmt.Errorf("runtime %+v, want the roll waiting out the pace after cell-01", *r)
		}
		return nil
	})
	first = h.slot("cell-01")
	if first.PID == before[0].PID || first.Runtime == nil || first.Runtime.Superseded || exeOf(first.PID) != bin {
		t.Fatalf("cell-01: pid %d (was %d), runtime %+v, exe %s: want a new master on the new binary", first.PID, before[0].PID, first.Runtime, exeOf(first.PID))
	}
	if r := h.sup.Status().Runtime; !strings.Contains(r.Reason, "runtime_upgrade_pace 1h0m0s") || r.Superseded != 1 {
		t.Errorf("runtime %+v, want the pace named and cell-02 alone superseded", *r)
	}
	second := h.slot("cell-02")
	if second.PID != before[1].PID || second.Runtime == nil || !second.Runtime.Superseded {
		t.Fatalf("cell-02: pid %d (was %d), runtime %+v: want it left on the old binary during the pace", second.PID, before[1].PID, second.Runtime)
	}
	return h, before, first
}

// Under runtime_upgrade: paced the roll takes one cell, then waits the pace
// with the next cell on the old binary, and status says so; a reload that
// shortens the pace lets the roll go on at once.
func TestPacedPolicyRollsOneCellAPace(t *testing.T) {
	h, before, _ := pacedAfterFirst(t)
	if err := h.sup.Update(context.Background(), supervisor.Settings{Limits: h.opts.Limits,
		RuntimeUpgrade: supervisor.UpgradePaced, RuntimeUpgradePace: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, func() error {
		st := h.sup.Status()
		if st.Runtime.Superseded != 0 || st.Runtime.Upgrade != supervisor.UpgradeIdle || st.Runtime.Reason != "" {
			return fmt.Errorf("runtime %+v, want every cell rolled", *st.Runtime)
		}
		if s := h.slot("cell-02"); s.State != supervisor.StateReady || s.PID == before[1].PID {
			return fmt.Errorf("cell-02: %s pid %d, want a new master ready", s.State, s.PID)
		}
		return nil
	})
}

// A cell that does not stay ready on the new binary during the pace (its
// master dies) stops a paced roll: the next cell keeps the old binary, and
// status says why.
func TestPacedRollStopsWhenTheRolledCellFails(t *testing.T) {
	h, before, first := pacedAfterFirst(t)
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var r supervisor.RuntimeStatus
	testutil.Eventually(t, 30*time.Second, func() error {
		r = *h.sup.Status().Runtime
		if r.Upgrade != supervisor.UpgradeFailed {
			return fmt.Errorf("runtime %+v, want the roll stopped", r)
		}
		return nil
	})
	if !strings.Contains(r.Reason, "cell-01 did not stay ready on the new binary") {
		t.Errorf("reason %q, want it to name cell-01 not staying ready", r.Reason)
	}
	second := h.slot("cell-02")
	if second.PID != before[1].PID || second.State != supervisor.StateReady || !second.Runtime.Superseded {
		t.Errorf("cell-02: %s pid %d (was %d), runtime %+v: want it serving on the old binary", second.State, second.PID, before[1].PID, second.Runtime)
	}
	if code, body, err := get(second.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
		t.Errorf("cell-02: %d %q %v, want it serving", code, body, err)
	}
}

// The operator's roll (cellvisor upgrade-runtime) during a pace takes the
// remaining cells at once; a reload to manual during a pace stops the roll
// where it is, the remaining cells waiting for the operator.
func TestPaceEndsForTheOperatorOrManual(t *testing.T) {
	t.Run("operator", func(t *testing.T) {
		h, before, _ := pacedAfterFirst(t)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if plan, err := h.sup.UpgradeRuntime(ctx, false); err != nil || !plan.Started || len(plan.Cells) != 1 || plan.Cells[0].Name != "cell-02" {
			t.Fatalf("operator's roll: %+v %v, want cell-02's started", plan, err)
		}
		h.waitReady("cell-02", before[1].PID)
		testutil.Eventually(t, 30*time.Second, func() error {
			if r := h.sup.Status().Runtime; r.Superseded != 0 || r.Upgrade != supervisor.UpgradeIdle {
				return fmt.Errorf("runtime %+v, want every cell rolled", *r)
			}
			return nil
		})
	})
	t.Run("manual", func(t *testing.T) {
		h, before, _ := pacedAfterFirst(t)
		if err := h.sup.Update(context.Background(), supervisor.Settings{Limits: h.opts.Limits, RuntimeUpgrade: supervisor.UpgradeManual}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 30*time.Second, func() error {
			if r := h.sup.Status().Runtime; r.Upgrade != supervisor.UpgradeWaiting || r.Superseded != 1 {
				return fmt.Errorf("runtime %+v, want cell-02 waiting for the operator", *r)
			}
			return nil
		})
		if s := h.slot("cell-02"); s.PID != before[1].PID {
			t.Errorf("cell-02: pid %d, want the old master %d", s.PID, before[1].PID)
		}
	})
}
