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
