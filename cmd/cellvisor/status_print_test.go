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

// upgrade-runtime's answer: the cells and how each would be moved, and
// whether anything changed.
func TestPrintPlan(t *testing.T) {
	cells := []supervisor.PlannedCell{{Name: "cell-01", Pool: "shared-default", PID: 10, Version: "nginx/1.22.1", How: supervisor.HowBinaryUpgrade}}
	for _, tc := range []struct {
		name string
		plan supervisor.UpgradePlan
		want []string
	}{
		{"dry run", supervisor.UpgradePlan{Binary: "/usr/sbin/nginx", Version: "nginx/1.22.2", Policy: supervisor.UpgradeManual, DryRun: true, Verified: true, Cells: cells},
			[]string{"runtime: /usr/sbin/nginx nginx/1.22.2 (runtime_upgrade: manual)", "passes -t", "cell-01  shared-default  10   nginx/1.22.1  nginx binary upgrade (USR2)", "dry run: nothing changed"}},
		{"dry run under paced", supervisor.UpgradePlan{Binary: "/usr/sbin/nginx", Policy: supervisor.UpgradePaced, DryRun: true, Verified: true, Cells: cells},
			[]string{"(runtime_upgrade: paced)", "each once the others of its pool are ready (without runtime_upgrade_pace: the operator's roll)"}},
		{"refused", supervisor.UpgradePlan{Binary: "/usr/sbin/nginx", Policy: supervisor.UpgradeAuto, Error: "module is not binary compatible", Cells: cells},
			[]string{"check: refused: module is not binary compatible", "no cell would be touched"}},
		{"started", supervisor.UpgradePlan{Binary: "/usr/sbin/nginx", Policy: supervisor.UpgradeAuto, Verified: true, Started: true, Cells: cells},
			[]string{"the roll has started"}},
		{"nothing to do", supervisor.UpgradePlan{Binary: "/usr/sbin/nginx", Policy: supervisor.UpgradeAuto, Verified: true},
			[]string{"nothing to roll"}},
	} {
		var b bytes.Buffer
		printPlan(&b, tc.plan)
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: output\n%s\nwant %q", tc.name, b.String(), w)
			}
		}
	}
}
