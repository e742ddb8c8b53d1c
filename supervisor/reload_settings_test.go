package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// Each setting the docs call reloadable (configuration.md, Reloading)
// reaches cells that run already, as documented. The log level and the
// limits have their own tests (cmd/cellvisor TestSIGHUPReload, adopt_test).

// restart.*: the crash backoff of a running cell follows a reloaded policy
// from its next exit. Before, each cell kept the policy it started with.
func TestReloadedRestartPolicyReachesRunningCells(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, policy: supervisor.Policy{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond, HealthyAfter: time.Hour}})
	first := h.waitReady("cell-01", 0)
	if err := h.sup.Update(context.Background(), supervisor.Settings{Limits: h.opts.Limits, Policy: supervisor.Policy{Initial: time.Hour, Max: time.Hour, HealthyAfter: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	// The first exit restarts at once; the second backs off by the policy.
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	second := h.waitReady("cell-01", first.PID)
	if err := syscall.Kill(second.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st := h.waitFor("cell-01", 10*time.Second, "backing off", func(s supervisor.SlotStatus) bool {
		return s.PID != second.PID && regexp.MustCompile(`restart in `).MatchString(s.Reason)
	})
	m := regexp.MustCompile(`restart in (\S+)`).FindStringSubmatch(st.Reason)
	d, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatalf("reason %q: %v", st.Reason, err)
	}
	if d < 10*time.Minute {
		t.Errorf("backoff %s after the reload to an initial delay of 1h: the running cell kept its old policy (%q)", d, st.Reason)
	}
}

// restart.drain_timeout: an operator restart of a running cell waits for
// requests in flight for the reloaded timeout, not the one it started with
// (30 s in the harness: the restart below would take that long).
func TestReloadedDrainTimeoutBoundsTheNextRestart(t *testing.T) {
	origin := newGateOrigin(t)
	h := newHarness(t, harnessOpts{slots: 1, domains: originDomain(origin.URL)})
	before := h.waitReady("cell-01", 0)
	if err := h.sup.Update(context.Background(), supervisor.Settings{Limits: h.opts.Limits, DrainTimeout: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if got := h.sup.DrainTimeout(); got != 300*time.Millisecond {
		t.Errorf("DrainTimeout() %s after the reload, want 300ms (control tasks bound restarts by it)", got)
	}
	go getWith(before.HTTPPort, "/slow", "held") // never answered until the origin is released
	<-origin.entered
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	st, err := h.sup.Restart(ctx, "cell-01")
	if err != nil {
		t.Fatalf("restart with a request held past the reloaded drain timeout: %v (the old 30 s timeout?)", err)
	}
	if st.PID == before.PID || st.State != supervisor.StateReady {
		t.Errorf("after the restart: %+v", st)
	}
}

// restart.rate_limit: the operator-restart limit reloaded to 1 refuses the
// second restart in the window.
func TestReloadedRestartLimitApplies(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1})
	h.waitReady("cell-01", 0)
	if err := h.sup.Update(context.Background(), supervisor.Settings{Limits: h.opts.Limits, RestartLimit: 1, RestartWindow: time.Hour}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.sup.Restart(ctx, "cell-01"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.sup.Restart(ctx, "cell-01"); !errors.Is(err, supervisor.ErrRateLimited) {
		t.Errorf("second restart with the limit reloaded to 1: %v, want rate limited", err)
	}
}

// liveness.*: a reloaded liveness policy applies from the cell's next
// readiness: after a restart, a hung worker is found by the new checks.
func TestReloadedLivenessAppliesFromTheNextReadiness(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, liveness: supervisor.LivenessPolicy{Interval: time.Hour, Timeout: time.Second, FailureThreshold: 3, RestartThreshold: 6}})
	h.waitReady("cell-01", 0)
	if err := h.sup.Update(context.Background(), supervisor.Settings{Limits: h.opts.Limits, Liveness: fastLiveness}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.sup.Restart(ctx, "cell-01")
	if err != nil {
		t.Fatal(err)
	}
	signal(t, syscall.SIGSTOP, workers(t, h, "cell-01")...)
	h.waitFor("cell-01", 20*time.Second, fmt.Sprintf("degraded by the reloaded checks (pid %d)", st.PID), func(s supervisor.SlotStatus) bool {
		return s.State == supervisor.StateDegraded || s.PID != st.PID
	})
}

// A reload asked for while a cell's master is starting is held until the
// master answers its readiness probe, then sent: a SIGHUP before nginx
// has its signal handlers kills the master (here, a start that waits in
// a shell before it execs nginx: the shell dies of SIGHUP).
func TestReloadWaitsForTheMasterToAnswer(t *testing.T) {
	bin, _ := testutil.RequireOpenResty(t)
	slow := filepath.Join(t.TempDir(), "openresty")
	if err := os.WriteFile(slow, []byte("#!/bin/sh\nsleep 1\nexec "+bin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, harnessOpts{slots: 1, binary: slow})
	first := h.waitReady("cell-01", 0)
	// A crash: the cell starts again, through the slow start.
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var starting supervisor.SlotStatus
	h.waitFor("cell-01", 10*time.Second, "started again, not ready yet", func(s supervisor.SlotStatus) bool {
		starting = s
		return s.PID != 0 && s.PID != first.PID && s.State != supervisor.StateReady
	})
	if err := h.sup.Reload("cell-01"); err != nil {
		t.Fatal(err)
	}
	ready := h.waitReady("cell-01", first.PID)
	if ready.PID != starting.PID || ready.Restarts != first.Restarts+1 {
		t.Errorf("a reload while the cell started killed its master: pid %d (was %d), %d restarts (was %d), last exit %q", ready.PID, starting.PID, ready.Restarts, first.Restarts, ready.LastExit)
	}
}
