package controlapi_test

import (
	"crypto/rand"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi"
	"cellvisor/controlapi/store"
	"cellvisor/testkit/testutil"
)

// The poll is the heartbeat: an edge whose only contact is a poll held
// for longer than the fleet page's silence is still seen (a held poll is
// one in progress), and every poll answer assigns the status interval.
func TestHeldPollIsTheHeartbeat(t *testing.T) {
	clk := newClock()
	key := make([]byte, 32)
	rand.Read(key)
	e := serveWith(t, filepath.Join(t.TempDir(), "control.db"), key, func(o *controlapi.Options) {
		o.Now, o.Store.Now = clk.Now, clk.Now
		o.TouchInterval = 20 * time.Millisecond
		o.StatusInterval = 2 * time.Minute
	})
	created := e.createEdge(t, "fra-1")
	_, _, dir := e.enroll(t, created.Token)
	c := e.longPollClient(t, dir, time.Minute)
	ch := holdPoll(t, e, c, 1)
	clk.add(3 * time.Minute) // longer than the fleet page's SilentAfter, 2 minutes
	testutil.Eventually(t, 10*time.Second, func() error {
		v, err := e.admin.Edge(ctx(t), created.Edge.ID)
		if err != nil {
			return err
		}
		if v.LastSeen == nil || clk.Now().Sub(*v.LastSeen) > time.Minute {
			return fmt.Errorf("last seen %v with a poll held at %s: want within a minute", v.LastSeen, clk.Now())
		}
		return nil
	})
	e.srv.StopHolds()
	<-ch
	if got := c.StatusInterval(); got != 2*time.Minute {
		t.Fatalf("status interval after a poll: %s, want the 2m the control API assigns", got)
	}
}

// A status interval out of its bounds is refused, naming them.
func TestStatusIntervalBounds(t *testing.T) {
	st, err := store.Open(ctx(t), filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, d := range []time.Duration{10 * time.Second, time.Hour} {
		_, err := controlapi.New(ctx(t), controlapi.Options{Store: st, SealKey: make([]byte, 32), AdminToken: "test-admin-token-0123456789",
			SnapshotDir: t.TempDir(), StatusInterval: d})
		if err == nil || !strings.Contains(err.Error(), "want 30s–30m0s") {
			t.Errorf("status interval %s: %v, want refused naming 30s–30m0s", d, err)
		}
	}
}
