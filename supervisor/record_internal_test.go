package supervisor

import (
	"errors"
	"io/fs"
	"os"
	"testing"
	"time"

	"cellvisor/internal/clock"
)

// childStartTicks reads a live process's start time; for a process whose
// /proc entry is missing it reads again until the process is known to have
// exited (or the bound), then says why.
func TestChildStartTicks(t *testing.T) {
	c := &slot{s: &Supervisor{clk: clock.Or(nil)}}
	ticks, err := c.childStartTicks(os.Getpid(), nil)
	if err != nil || ticks == 0 {
		t.Fatalf("own start time: %d %v", ticks, err)
	}
	exited := make(chan struct{})
	close(exited)
	start := time.Now()
	// A pid above pid_max's default names no process.
	if _, err := c.childStartTicks(1<<22+1, exited); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing process: %v, want not exist", err)
	}
	if d := time.Since(start); d > childHiddenFor/2 {
		t.Errorf("a process known to have exited took %s to give up on", d)
	}
}
