package supervisor_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"cellvisor/supervisor"
)

// A Run that cannot begin (here a cell's log budget is refused) returns
// having started nothing, and leaves nothing of Prepare's: no cell process,
// no cell cgroup, no port bound. It used to return with the cells started
// and their routines running (issue 33).
func TestRunRefusedLeavesNothingRunning(t *testing.T) {
	h := layoutHarness(t, harnessOpts{slots: 2})
	h.opts.LogBudget = -1
	sup, err := supervisor.New(h.opts)
	if err != nil {
		t.Fatal(err)
	}
	sup.Prepare()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sup.Run(ctx); err == nil {
		t.Fatal("Run with a refused log budget: no error")
	}
	if names, err := h.cg.List(); err != nil || len(names) != 0 {
		t.Errorf("cell cgroups after the refused Run: %v %v", names, err)
	}
	for _, s := range sup.Status().Slots {
		if s.PID != 0 {
			t.Errorf("%s: pid %d after the refused Run", s.Name, s.PID)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(s.HTTPPort))
		if err != nil {
			t.Errorf("%s: port %d still bound after the refused Run: %v", s.Name, s.HTTPPort, err)
			continue
		}
		l.Close()
	}
}
