package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// A second agent on the running agent's state directory, or on its cgroup
// subtree with state and run directories of its own, refuses to start with
// the reason, and the first agent's cells keep running, untouched.
func TestSecondAgentRefusedAndTouchesNothing(t *testing.T) {
	testutil.RequireCgroups(t)
	bin := buildAgent(t)
	cfgPath, cfg := agentConfig(t, 2, "")
	first, st := startAgent(t, bin, cfgPath, cfg)
	pids := map[string]int{}
	for _, s := range st.Slots {
		if s.State == supervisor.StateReady {
			pids[s.Name] = s.PID
		}
	}
	if len(pids) == 0 {
		t.Fatalf("no ready cell to watch: %+v", st.Slots)
	}
	orig, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}

	base := testutil.PortBase(t, 4)
	ports := regexp.MustCompile(`(?m)^  http_base: \d+\n  https_base: \d+$`)
	other := t.TempDir()
	for _, tc := range []struct {
		name, want string
		edit       func(string) string
	}{
		{"same state directory", "state directory in use by another agent", func(y string) string {
			return strings.Replace(y, "run_dir: "+cfg.RunDir, "run_dir: "+filepath.Join(other, "run-a"), 1)
		}},
		{"same cgroup subtree", "cgroup subtree in use by another agent", func(y string) string {
			y = strings.Replace(y, "state_dir: "+cfg.StateDir, "state_dir: "+filepath.Join(other, "state-b"), 1)
			y = strings.Replace(y, "run_dir: "+cfg.RunDir, "run_dir: "+filepath.Join(other, "run-b"), 1)
			return y
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := ports.ReplaceAllString(tc.edit(string(orig)), fmt.Sprintf("  http_base: %d\n  https_base: %d", base, base+2))
			if y == string(orig) {
				t.Fatal("the edited configuration is the original")
			}
			path := filepath.Join(other, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "--config", path, "run").CombinedOutput()
			if err == nil || ctx.Err() != nil {
				t.Fatalf("second agent: %v (context %v), want a refusal\n%s", err, ctx.Err(), out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("second agent said:\n%s\nwant %q", out, tc.want)
			}
		})
	}

	// The first agent's cells: same masters, alive, ready.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now, err := adminsock.FetchStatus(ctx, agent.AdminSocket(cfg))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range now.Slots {
		if pid, ok := pids[s.Name]; ok && (s.PID != pid || s.State != supervisor.StateReady || !testutil.Alive(pid)) {
			t.Errorf("%s: %s pid %d (alive %v), was ready with pid %d", s.Name, s.State, s.PID, testutil.Alive(pid), pid)
		}
	}
	if code := first.stop(t); code != 0 {
		t.Errorf("first agent exited %d", code)
	}
}
