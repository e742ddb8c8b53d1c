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
