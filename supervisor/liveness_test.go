package supervisor_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// fastLiveness detects a hung cell in about a second.
var fastLiveness = supervisor.LivenessPolicy{Interval: 100 * time.Millisecond, Timeout: 200 * time.Millisecond, FailureThreshold: 3, RestartThreshold: 8}

// workers are a running cell's processes but its master (and its slot's
// standby, which is no part of the running cell).
func workers(t *testing.T, h *harness, name string) []int {
	t.Helper()
	master := h.slot(name).PID
	var out []int
	for _, pid := range nginxProcs(t, h, name) {
		if pid != master {
			out = append(out, pid)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no worker", name)
	}
	return out
}

// signal sends sig to pids, and SIGCONT when the test ends (a stopped
// process left behind would hold its cgroup).
func signal(t *testing.T, sig syscall.Signal, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatal(err)
		}
	}
	if sig == syscall.SIGSTOP {
		t.Cleanup(func() {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		})
	}
}

// waitFor waits until cond holds for the slot's status.
func (h *harness) waitFor(name string, timeout time.Duration, what string, cond func(supervisor.SlotStatus) bool) supervisor.SlotStatus {
	h.t.Helper()
	var st supervisor.SlotStatus
	testutil.Eventually(h.t, timeout, func() error {
		if st = h.slot(name); !cond(st) {
			return fmt.Errorf("%s: want %s, have %s pid %d (%s), liveness %+v", name, what, st.State, st.PID, st.Reason, st.Liveness)
		}
		return nil
	})
	return st
}

// A cell whose worker hangs (SIGSTOP) is degraded, with the reason, after
// FailureThreshold failed checks, and restarted after RestartThreshold,
// counted like a crash; its neighbour is not disturbed.
func TestHungWorkerIsDegradedThenRestarted(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 2, liveness: fastLiveness})
	before := h.waitReady("cell-01", 0)
	other := h.waitReady("cell-02", 0)
	signal(t, syscall.SIGSTOP, workers(t, h, "cell-01")...)

	st := h.waitFor("cell-01", 10*time.Second, "degraded", func(s supervisor.SlotStatus) bool {
		return s.State == supervisor.StateDegraded && s.PID == before.PID
	})
	if !strings.Contains(st.Reason, "not answering") {
		t.Errorf("degraded with reason %q, want it to say the cell is not answering", st.Reason)
	}
	after := h.waitReady("cell-01", before.PID)
	if after.Restarts != before.Restarts+1 || !strings.Contains(after.LastExit, "not answering") {
		t.Errorf("after the restart: %d restarts (was %d), last exit %q", after.Restarts, before.Restarts, after.LastExit)
	}
	if code, body, err := get(after.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
		t.Errorf("after restart: %d %q %v", code, body, err)
	}
	if now := h.slot("cell-02"); now.PID != other.PID || now.State != supervisor.StateReady || now.Restarts != 0 {
		t.Errorf("cell-02 disturbed: %+v", now)
	}
}

// The master stopped and its worker killed: nothing answers, and the cell
// is restarted (the stopped master is killed with its group).
func TestStoppedMasterKilledWorkerIsRestarted(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, liveness: fastLiveness})
	before := h.waitReady("cell-01", 0)
	ws := workers(t, h, "cell-01")
	signal(t, syscall.SIGSTOP, before.PID)
	signal(t, syscall.SIGKILL, ws...)
	after := h.waitReady("cell-01", before.PID)
	if !strings.Contains(after.LastExit, "not answering") {
		t.Errorf("last exit %q", after.LastExit)
	}
	if testutil.Alive(before.PID) {
		t.Errorf("the stopped master %d is still alive", before.PID)
	}
}

// A drained cell answers its readiness path with 503: that is an answer,
// and it is never restarted for it.
func TestDrainedCellIsNotRestartedForItsAnswer(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, liveness: fastLiveness})
	before := h.waitReady("cell-01", 0)
	if _, err := h.sup.Drain(t.Context(), "cell-01"); err != nil {
		t.Fatal(err)
	}
	if code := readiness(t, before.HTTPPort); code != 503 {
		t.Fatalf("drained readiness %d, want 503", code)
	}
	// Twice as many checks as it takes to restart a hung cell.
	var from int64
	if l := h.slot("cell-01").Liveness; l != nil {
		from = l.Checks
	}
	st := h.waitFor("cell-01", 20*time.Second, "many checks", func(s supervisor.SlotStatus) bool {
		return s.Liveness != nil && s.Liveness.Checks >= from+int64(2*fastLiveness.RestartThreshold)
	})
	if st.PID != before.PID || st.State != supervisor.StateDrained || st.Restarts != 0 || st.Liveness.Failures != 0 {
		t.Errorf("drained cell after %d checks: %+v", st.Liveness.Checks, st)
	}
}

// A stall shorter than the restart threshold degrades the cell, and once
// it answers again it is ready, without a restart.
func TestBriefStallRecoversWithoutRestart(t *testing.T) {
	p := fastLiveness
	p.RestartThreshold = 20 // room between degraded (3) and a restart
	h := newHarness(t, harnessOpts{slots: 1, liveness: p})
	before := h.waitReady("cell-01", 0)
	ws := workers(t, h, "cell-01")
	signal(t, syscall.SIGSTOP, ws...)
	h.waitFor("cell-01", 10*time.Second, "degraded", func(s supervisor.SlotStatus) bool {
		return s.State == supervisor.StateDegraded
	})
	signal(t, syscall.SIGCONT, ws...)
	st := h.waitFor("cell-01", 10*time.Second, "ready again", func(s supervisor.SlotStatus) bool {
		return s.State == supervisor.StateReady && s.Liveness != nil && s.Liveness.Failures == 0
	})
	if st.PID != before.PID || st.Restarts != 0 {
		t.Errorf("after a brief stall: pid %d (was %d), %d restarts", st.PID, before.PID, st.Restarts)
	}
}

// A drain of a hung cell is kept (before, the failed call to the cell put
// the marker back): status says drained at once, and the cell comes back
// from its liveness restart drained, out of rotation until an undrain.
func TestDrainOfAHungCellIsKept(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, liveness: fastLiveness})
	before := h.waitReady("cell-01", 0)
	signal(t, syscall.SIGSTOP, workers(t, h, "cell-01")...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := h.sup.Drain(ctx, "cell-01")
	if err != nil {
		t.Fatalf("drain of a hung cell: %v, want it kept", err)
	}
	if !st.Drained {
		t.Errorf("status after the drain: %+v, want drained", st)
	}
	after := h.waitFor("cell-01", 20*time.Second, "restarted, drained", func(s supervisor.SlotStatus) bool {
		return s.PID != 0 && s.PID != before.PID && s.State == supervisor.StateDrained
	})
	if !after.Drained {
		t.Errorf("after the restart: %+v, want drained", after)
	}
	if code := readiness(t, after.HTTPPort); code != 503 {
		t.Errorf("readiness of the restarted drained cell: %d, want 503", code)
	}
}

// A drain kept while the cell did not answer reaches the cell once it
// answers again, without a restart.
func TestKeptDrainReachesTheCellWhenItAnswers(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, monitor: 50 * time.Millisecond})
	before := h.waitReady("cell-01", 0)
	ws := workers(t, h, "cell-01")
	signal(t, syscall.SIGSTOP, ws...)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := h.sup.Drain(ctx, "cell-01"); err != nil {
		t.Fatalf("drain of a stalled cell: %v, want it kept", err)
	}
	signal(t, syscall.SIGCONT, ws...)
	api := privateClient(t, h, "cell-01", nil)
	testutil.Eventually(t, 20*time.Second, func() error {
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		defer scancel()
		st, err := api.Status(sctx)
		if err != nil {
			return err
		}
		if !st.Drained {
			return fmt.Errorf("the cell is not drained yet")
		}
		return nil
	})
	if now := h.slot("cell-01"); now.PID != before.PID {
		t.Errorf("the cell was restarted (%d, was %d): the drain should have reached it", now.PID, before.PID)
	}
	if code := readiness(t, before.HTTPPort); code != 503 {
		t.Errorf("readiness: %d, want 503", code)
	}
}

// A cell whose every connection is held by slow clients (headers that never
// end) is alive: its liveness checks are accepted and closed at once. It is
// shown overloaded, with its port's sockets, and never restarted for it
// (which cut every tenant's requests in flight); its neighbour serves on.
func TestOverloadedCellIsNotRestarted(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 2, liveness: fastLiveness, workerConns: 32})
	before := h.waitReady("cell-01", 0)
	other := h.waitReady("cell-02", 0)
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range 1000 { // past worker_connections
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(before.HTTPPort)), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nX-Slow: ", testHost) // never ends
	}
	st := h.waitFor("cell-01", 20*time.Second, "overloaded", func(s supervisor.SlotStatus) bool {
		return s.Liveness != nil && s.Liveness.Overloaded
	})
	if st.Liveness.Sockets == nil || st.Liveness.Sockets.Established < 16 {
		t.Errorf("sockets of an overloaded cell: %+v, want the held connections counted", st.Liveness.Sockets)
	}
	// Twice as many checks as it takes to restart a hung cell.
	h.waitFor("cell-01", 20*time.Second, "overloaded for many checks", func(s supervisor.SlotStatus) bool {
		return s.Liveness != nil && s.Liveness.Overloads >= int64(2*fastLiveness.RestartThreshold)
	})
	if now := h.slot("cell-01"); now.PID != before.PID || now.Restarts != before.Restarts || now.State != supervisor.StateReady {
		t.Errorf("an overloaded cell was restarted or degraded: %+v", now)
	}
	if code := readiness(t, other.HTTPPort); code != 200 {
		t.Errorf("the neighbour's readiness: %d", code)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	h.waitFor("cell-01", 20*time.Second, "taking connections again", func(s supervisor.SlotStatus) bool {
		return s.Liveness != nil && !s.Liveness.Overloaded && s.Liveness.Checks > 0
	})
}
