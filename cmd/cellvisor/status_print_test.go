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

// The status table shows what each assigned cell holds on disk against
// its budgets, in percent, and "-" where the agent has not measured.
func TestStatusShowsDiskUse(t *testing.T) {
	var b bytes.Buffer
	printStatus(&b, supervisor.Status{PID: 1, StartedAt: time.Now(), Slots: []supervisor.SlotStatus{
		{Name: "cell-01", Pool: "shared-default", State: supervisor.StateReady, Disk: &supervisor.DiskUse{
			Cache:      supervisor.DiskBudget{Bytes: 192 << 20, Budget: 256 << 20},
			RequestTmp: supervisor.DiskBudget{Bytes: 2 << 20, Unlinked: 2 << 20, Budget: 64 << 20},
			Logs:       supervisor.DiskBudget{Bytes: 2 << 20, Budget: 16 << 20}}},
		{Name: "cell-02", State: supervisor.StateStopped},
	}})
	lines := strings.Split(b.String(), "\n")
	var header, one, two string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "CELL"):
			header = l
		case strings.HasPrefix(l, "cell-01"):
			one = l
		case strings.HasPrefix(l, "cell-02"):
			two = l
		}
	}
	col := strings.Index(header, "DISK")
	if col < 0 || len(one) <= col || len(two) <= col {
		t.Fatalf("no DISK column:\n%s", b.String())
	}
	if got := strings.Fields(one[col:]); len(got) < 3 || strings.Join(got[:3], " ") != "c75% r3% l12%" {
		t.Errorf("cell-01's DISK %q, want c75%% r3%% l12%%:\n%s", got, b.String())
	}
	if got := strings.Fields(two[col:]); len(got) == 0 || got[0] != "-" {
		t.Errorf("cell-02's DISK %q, want -:\n%s", got, b.String())
	}
}
