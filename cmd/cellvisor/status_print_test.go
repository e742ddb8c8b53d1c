package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"cellvisor/supervisor"
)

// The status table says whom the cells run as, and why not their own
// users when they are not (control characters of the reason escaped).
func TestStatusSaysWhomCellsRunAs(t *testing.T) {
	for _, tc := range []struct{ users, want string }{
		{"slot", "cells run as their slots' own users\n"},
		{"agent", "cells run as the agent's user (cell_users: agent)\n"},
		{"agent: no user cellvisor-cell-01\x1b[2J", "cells run as the agent's user: no user cellvisor-cell-01\\x1b[2J\n"},
	} {
		var b bytes.Buffer
		printStatus(&b, supervisor.Status{PID: 1, StartedAt: time.Now(), CellUsers: tc.users})
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("cell_users %q: table\n%s\nwant a line %q", tc.users, b.String(), tc.want)
		}
	}
}

// The status table says which binary the cells run, how many run a
// replaced one, and on each such cell's line the versions old and new.
func TestStatusSaysWhichCellsRunASupersededRuntime(t *testing.T) {
	var b bytes.Buffer
	printStatus(&b, supervisor.Status{PID: 1, StartedAt: time.Now(),
		Runtime: &supervisor.RuntimeStatus{Binary: "/usr/sbin/nginx", Version: "nginx/1.22.2", Superseded: 1},
		Slots: []supervisor.SlotStatus{
			{Name: "cell-01", State: supervisor.StateReady, PID: 10, Runtime: &supervisor.CellRuntime{Version: "nginx/1.22.1", Superseded: true, Current: "nginx/1.22.2"}},
			{Name: "cell-02", State: supervisor.StateReady, PID: 11, Runtime: &supervisor.CellRuntime{Version: "nginx/1.22.2"}},
		}})
	out := b.String()
	if !strings.Contains(out, "runtime: /usr/sbin/nginx nginx/1.22.2, 1 cell(s) run a superseded binary\n") {
		t.Errorf("table\n%s\nwant the runtime line with one superseded cell", out)
	}
	for _, line := range strings.Split(out, "\n") {
		note := strings.Contains(line, "runs superseded nginx/1.22.1 (binary now nginx/1.22.2)")
		switch {
		case strings.HasPrefix(line, "cell-01") && !note:
			t.Errorf("cell-01's line %q does not say it runs a superseded runtime", line)
		case strings.HasPrefix(line, "cell-02") && note:
			t.Errorf("cell-02's line %q says superseded", line)
		}
	}
}
