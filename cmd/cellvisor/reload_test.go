package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/testkit/testutil"
)

// awaitLog waits until the agent's log holds want after offset, and returns
// the offset just past it.
func awaitLog(t *testing.T, a *runningAgent, offset int, want string) int {
	t.Helper()
	var at int
	testutil.Eventually(t, 30*time.Second, func() error {
		b, err := os.ReadFile(a.log)
		if err != nil {
			return err
		}
		if i := bytes.Index(b[offset:], []byte(want)); i >= 0 {
			at = offset + i + len(want)
			return nil
		}
		return fmt.Errorf("no %q in the agent's log yet", want)
	})
	return at
}

// SIGHUP re-reads agent.yaml: a changed log level applies at once (info
// lines stop, warnings still come); a changed slot count is refused with
// the reason, nothing is applied and no cell restarts.
func TestSIGHUPReload(t *testing.T) {
	_, cfgPath, cfg, a, _, pids := twoCellAgent(t)
	orig, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(pairs ...string) {
		y := string(orig)
		for i := 0; i < len(pairs); i += 2 {
			if !strings.Contains(y, pairs[i]) {
				t.Fatalf("no %q in the configuration", pairs[i])
			}
			y = strings.Replace(y, pairs[i], pairs[i+1], 1)
		}
		if err := os.WriteFile(cfgPath, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// A slot count change is refused; nothing restarts. (The HTTPS ports
	// move up so the file stays valid with 3 slots.)
	edit("slots: 2\n", "slots: 3\n",
		fmt.Sprintf("https_base: %d\n", cfg.Ports.HTTPSBase), fmt.Sprintf("https_base: %d\n", cfg.Ports.HTTPSBase+1))
	if err := a.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	off := awaitLog(t, a, 0, "configuration reload refused")
	b, _ := os.ReadFile(a.log)
	if line, _, _ := bytes.Cut(b[off:], []byte("\n")); !bytes.Contains(line, []byte("slots, ports.https_base cannot change")) {
		t.Errorf("refusal %q does not name the slot count", line)
	}
	now := mustStatus(t, cfg)
	if len(now.Slots) != 2 {
		t.Errorf("%d slots after a refused reload, want 2", len(now.Slots))
	}
	for _, s := range now.Slots {
		if s.PID != pids[s.Name] || s.Restarts != 0 {
			t.Errorf("%s: pid %d (was %d), %d restarts: a refused reload restarted it", s.Name, s.PID, pids[s.Name], s.Restarts)
		}
	}

	// A log level change applies: after it, a crash logs its warning but
	// none of the info lines that come with it at debug.
	edit("level: debug\n", "level: warn\n")
	if err := a.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	off = awaitLog(t, a, off, "configuration reloaded")
	for _, s := range mustStatus(t, cfg).Slots {
		if s.PID != pids[s.Name] {
			t.Errorf("%s: pid %d, was %d: the reload restarted it", s.Name, s.PID, pids[s.Name])
		}
	}
	if err := syscall.Kill(pids["cell-01"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	awaitLog(t, a, off, "cell exited")
	testutil.Eventually(t, 30*time.Second, func() error {
		for _, s := range mustStatus(t, cfg).Slots {
			if s.Name == "cell-01" && (s.State != "ready" || s.PID == pids["cell-01"]) {
				return fmt.Errorf("cell-01 is %s pid %d", s.State, s.PID)
			}
		}
		return nil
	})
	b, _ = os.ReadFile(a.log)
	for _, quiet := range []string{`"cell state"`, `"cell started"`} {
		if bytes.Contains(b[off:], []byte(quiet)) {
			t.Errorf("%s logged after the level was set to warn:\n%s", quiet, b[off:])
		}
	}
}
