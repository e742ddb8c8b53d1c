package main

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"cellvisor/controlclient"
	"cellvisor/manifest"
	"cellvisor/runtime"
	"cellvisor/testkit/testutil"
)

// SIGKILL the agent at random points during activations, 100 times: after
// every kill each slot's current link points to a whole, verified release
// (old or new, never a mix), and in the end every journaled ack reaches the
// source (which de-duplicates by sequence) and the journal is empty.
func TestActivationSurvivesSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("100 agent kills; skipped in -short mode")
	}
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	spoolDir := filepath.Join(t.TempDir(), "spool")
	cfgPath, cfg := agentConfig(t, 2, fmt.Sprintf("source:\n  dir: %s\n  poll_interval: 100ms\n  max_backoff: 200ms\n", spoolDir))
	sp := newSpool(t, cfg, spoolDir)
	topo := runtime.Plan(runtime.Layout{Slots: 2, HTTPBase: cfg.Ports.HTTPBase, HTTPSBase: cfg.Ports.HTTPSBase, StateDir: cfg.StateDir, RunDir: cfg.RunDir})
	rng := rand.New(rand.NewPCG(1, 2))
	const rounds = 100
	for i := int64(1); i <= rounds; i++ {
		sp.publish(t, i, fmt.Sprintf("v%d", i), 40, false)
		cmd := exec.Command(bin, "--config", cfgPath, "run")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill somewhere in start-up, activation or just after.
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		for _, s := range topo.Slots {
			m, err := runtime.Current(s)
			if err == runtime.ErrNoRelease {
				continue // killed before the first activation
			}
			if err != nil {
				t.Fatalf("round %d, %s: %v", i, s.Name, err)
			}
			if _, err := runtime.VerifyRelease(filepath.Join(s.RuntimeDir(), "current")); err != nil {
				t.Fatalf("round %d, %s: current is not a whole release: %v", i, s.Name, err)
			}
			if m.Sequence > i {
				t.Fatalf("round %d, %s: release %d was never published", i, s.Name, m.Sequence)
			}
		}
	}
	// A final, undisturbed run catches up: the last sequence is applied and
	// every ack journaled in any round is delivered.
	a, st := startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, st.Slots[0].HTTPPort, fmt.Sprintf("v%d", rounds))
	awaitAck(t, sp, rounds, manifest.AckApplied)
	testutil.Eventually(t, 30*time.Second, func() error {
		if c := mustStatus(t, cfg).Control; c == nil || c.PendingAcks != 0 {
			return fmt.Errorf("acks still pending: %+v", c)
		}
		return nil
	})
	a.stop(t)
	journal, err := controlclient.OpenJournal(filepath.Join(cfg.StateDir, "acks.journal"), nil)
	if err != nil || len(journal.Pending()) != 0 {
		t.Fatalf("journal after the final run: %v, %v", journal.Pending(), err)
	}
	acks, err := sp.src.Acks()
	if err != nil {
		t.Fatal(err)
	}
	for seq, a := range acks {
		if a.Status != manifest.AckApplied && a.Status != manifest.AckPartial {
			t.Errorf("ack of %d: %+v: every published manifest was valid", seq, a)
		}
	}
	t.Logf("%d kills; %d sequences acknowledged (later ones supersede those a kill interrupted)", rounds, len(acks))
}
