package supervisor_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"cellvisor/agent"
	"cellvisor/domain"
	"cellvisor/runtime"
	"cellvisor/testkit/testutil"
)

// After a reload, a cell has loaded the new release only once no worker of
// before the reload still listens: an old worker that has not taken up its
// shutdown (here: stopped) may accept a connection and answer it from the
// old release, so Loaded does not report the new sequence until it is gone.
func TestLoadedWaitsForOldWorkersToStopListening(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1})
	st := h.waitReady("cell-01", 0)
	old := workers(t, h, "cell-01")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if seq, ok, err := h.sup.Loaded(ctx, "cell-01"); err != nil || !ok || seq != 1 {
		t.Fatalf("before: loaded %d %v %v, want 1", seq, ok, err)
	}

	// Release 2 adds a domain; the old worker cannot take up its shutdown.
	signal(t, syscall.SIGSTOP, old...)
	s := h.slotSpec("cell-01")
	pools, err := runtime.CompilePools([]domain.Domain{
		{Domain: testHost, Pool: domain.PoolSharedDefault, Revision: 2, Hostnames: []string{testHost},
			Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: "two"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.BuildRelease(agent.RenderParams(h.cfg, s, domain.PoolSharedDefault, 2), pools[domain.PoolSharedDefault])
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runtime.Activate(s, r); err != nil {
		t.Fatal(err)
	}
	if err := h.sup.Reload("cell-01"); err != nil {
		t.Fatal(err)
	}
	// The new worker serves release 2 (it answers the private status)...
	api := privateClient(t, h, "cell-01", nil)
	testutil.Eventually(t, 20*time.Second, func() error {
		cs, err := api.Status(ctx)
		if err == nil && cs.Sequence != 2 {
			err = fmt.Errorf("cell reports %d", cs.Sequence)
		}
		return err
	})
	// ...but the stopped old worker still listens: not loaded.
	if seq, ok, err := h.sup.Loaded(ctx, "cell-01"); err != nil || !ok || seq == 2 {
		t.Errorf("with the old worker still listening: loaded %d %v %v, want not 2", seq, ok, err)
	}
	signal(t, syscall.SIGCONT, old...)
	testutil.Eventually(t, 20*time.Second, func() error {
		seq, _, err := h.sup.Loaded(ctx, "cell-01")
		if err == nil && seq != 2 {
			err = fmt.Errorf("loaded %d", seq)
		}
		return err
	})
	if now := h.slot("cell-01"); now.PID != st.PID {
		t.Errorf("the master changed: %d → %d", st.PID, now.PID)
	}
}
