package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cellvisor/config"
	"cellvisor/runtime"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// kill9 SIGKILLs the agent and waits until it is reaped.
func (a *runningAgent) kill9(t testing.TB) {
	t.Helper()
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-a.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("agent not reaped within 30s of SIGKILL")
	}
}

// readyPIDs returns the masters of ready cells by slot.
func readyPIDs(st supervisor.Status) map[string]int {
	pids := map[string]int{}
	for _, s := range st.Slots {
		if s.State == supervisor.StateReady && s.PID != 0 {
			pids[s.Name] = s.PID
		}
	}
	return pids
}

// twoCellAgent starts the real agent with two slots, both assigned, and
// returns it with its ready masters by cell.
func twoCellAgent(t *testing.T) (bin, cfgPath string, cfg config.Agent, a *runningAgent, st supervisor.Status, pids map[string]int) {
	t.Helper()
	testutil.RequireCgroups(t)
	bin = buildAgent(t)
	cfgPath, cfg = agentConfig(t, 2, "")
	a, st = startAgent(t, bin, cfgPath, cfg)
	pids = readyPIDs(st)
	if len(pids) != 2 {
		t.Fatalf("ready cells %v, want cell-01 and cell-02", pids)
	}
	return bin, cfgPath, cfg, a, st, pids
}

// stream sends a request to every port every 10ms until ctx ends, and
// counts the requests that did not get a 200.
type stream struct {
	sent, failed atomic.Int64
	mu           sync.Mutex
	firstErr     error
}

func (s *stream) run(ctx context.Context, ports []int) {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, port := range ports {
			s.sent.Add(1)
			resp, err := hc.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/.cellvisor/ready")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("port %d: %s", port, resp.Status)
				}
			}
			if err != nil {
				s.failed.Add(1)
				s.mu.Lock()
				if s.firstErr == nil {
					s.firstErr = err
				}
				s.mu.Unlock()
			}
		}
	}
}

// Cells outlive the agent: SIGKILLed and started again 5 times under a
// steady stream of requests to both cells, no request fails and the new
// agent adopts the same masters; a cell killed while the agent is down is
// restarted once it is back, while the other is adopted.
func TestCellsOutliveAgentSIGKILL(t *testing.T) {
	bin, cfgPath, cfg, a, st, pids := twoCellAgent(t)
	var ports []int
	for _, s := range st.Slots {
		ports = append(ports, s.HTTPPort)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var s stream
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.run(ctx, ports) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	for round := 1; round <= 5; round++ {
		a.kill9(t)
		// The agent is down: the cells keep serving the stream (ten more
		// requests to each before it is started again).
		down := s.sent.Load()
		testutil.Eventually(t, 10*time.Second, func() error {
			if n := s.sent.Load() - down; n < int64(10*len(ports)) {
				return fmt.Errorf("%d requests while the agent is down", n)
			}
			return nil
		})
		a, st = startAgent(t, bin, cfgPath, cfg)
		if got := readyPIDs(st); !maps.Equal(got, pids) {
			t.Fatalf("round %d: ready masters %v, want the same %v adopted", round, got, pids)
		}
	}
	cancel()
	wg.Wait()
	if s.failed.Load() != 0 || s.sent.Load() < 50 {
		t.Fatalf("%d of %d requests failed (first: %v)", s.failed.Load(), s.sent.Load(), s.firstErr)
	}
	t.Logf("%d requests across 5 agent kills, none failed", s.sent.Load())

	// A cell killed while the agent is down is restarted when it is back.
	a.kill9(t)
	if err := syscall.Kill(pids["cell-02"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, st = startAgent(t, bin, cfgPath, cfg)
	got := readyPIDs(st)
	if got["cell-01"] != pids["cell-01"] {
		t.Errorf("cell-01: pid %d, want %d adopted", got["cell-01"], pids["cell-01"])
	}
	if got["cell-02"] == 0 || got["cell-02"] == pids["cell-02"] {
		t.Errorf("cell-02: pid %d, want a fresh master after %d was killed", got["cell-02"], pids["cell-02"])
	}
	if testutil.Alive(pids["cell-02"]) {
		t.Errorf("killed master %d still alive", pids["cell-02"])
	}
}

// A pid file naming an unrelated live process is never adopted nor
// signalled, and one naming another slot's master is not adopted for this
// slot: those slots get fresh cells, the other slot's master is adopted.
func TestAgentPidFileForgedNotAdopted(t *testing.T) {
	bin, cfgPath, cfg, a, _, pids := twoCellAgent(t)
	sleep := exec.Command("sleep", "1000")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = sleep.Wait(); close(exited) }()
	t.Cleanup(func() { _ = sleep.Process.Kill(); <-exited })
	topo := runtime.Plan(runtime.Layout{Slots: 2, HTTPBase: cfg.Ports.HTTPBase, HTTPSBase: cfg.Ports.HTTPSBase, StateDir: cfg.StateDir, RunDir: cfg.RunDir})
	write := func(slot string, pid int) {
		s, _ := topo.Slot(slot)
		if err := os.WriteFile(s.PidFile(), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// cell-02's pid file names cell-01's master.
	a.kill9(t)
	write("cell-02", pids["cell-01"])
	a, st := startAgent(t, bin, cfgPath, cfg)
	got := readyPIDs(st)
	if got["cell-01"] != pids["cell-01"] {
		t.Errorf("cell-01: pid %d, want %d adopted by its own slot", got["cell-01"], pids["cell-01"])
	}
	if got["cell-02"] == 0 || got["cell-02"] == pids["cell-01"] || got["cell-02"] == pids["cell-02"] {
		t.Errorf("cell-02: pid %d, want a fresh master (its pid file named cell-01's %d)", got["cell-02"], pids["cell-01"])
	}
	pids = got

	// cell-01's pid file names a sleep.
	a.kill9(t)
	write("cell-01", sleep.Process.Pid)
	_, st = startAgent(t, bin, cfgPath, cfg)
	got = readyPIDs(st)
	if got["cell-01"] == 0 || got["cell-01"] == sleep.Process.Pid || got["cell-01"] == pids["cell-01"] {
		t.Errorf("cell-01: pid %d, want a fresh master (its pid file named the sleep %d)", got["cell-01"], sleep.Process.Pid)
	}
	if got["cell-02"] != pids["cell-02"] {
		t.Errorf("cell-02: pid %d, want %d adopted", got["cell-02"], pids["cell-02"])
	}
	select {
	case <-exited:
		t.Errorf("the sleep named by a pid file was signalled: %v", sleep.ProcessState)
	default:
	}
}
