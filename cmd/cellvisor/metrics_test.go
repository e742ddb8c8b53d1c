package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/cgroup"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// scrape GETs the agent's /metrics and returns the body and its parsed families.
func scrape(t testing.TB, addr string) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	return testutil.Scrape(t, "http://"+addr+"/metrics", "")
}

// value is the one series of name with labels, or an error naming what is there.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, error) {
	f, ok := fams[name]
	if !ok {
		return 0, fmt.Errorf("no %s", name)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), nil
		case m.Counter != nil:
			return m.GetCounter().GetValue(), nil
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), nil
		}
	}
	return 0, fmt.Errorf("no %s%v among %d series", name, labels, len(f.GetMetric()))
}

func want(t testing.TB, fams map[string]*dto.MetricFamily, v float64, name string, labels ...string) error {
	t.Helper()
	got, err := value(fams, name, labels...)
	if err != nil {
		return err
	}
	if got != v {
		return fmt.Errorf("%s%v = %g, want %g", name, labels, got, v)
	}
	return nil
}

// A running agent with real cells, real cgroups and a spool source serves
// /metrics whose series follow the real state: an applied manifest, a
// killed cell's crash restart counter, a drained cell's gauges, the memory
// the cgroup's own file reports, and promtool accepts the scrape.
func TestMetricsFollowTheRealState(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	spoolDir := filepath.Join(t.TempDir(), "spool")
	port := testutil.PortBase(t, 1)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cfgPath, cfg := agentConfig(t, 2, fmt.Sprintf("metrics:\n  listen: %s\nsource:\n  dir: %s\n  poll_interval: 100ms\n  max_backoff: 200ms\n", addr, spoolDir))
	sp := newSpool(t, cfg, spoolDir)
	sp.publish(t, 1, "one", 0, false)
	startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, cfg.Ports.HTTPBase, "one")

	cell := []string{"cell", "cell-01", "pool", "shared-default"}
	var fams map[string]*dto.MetricFamily
	var body string
	testutil.Eventually(t, 30*time.Second, func() error {
		body, fams = scrape(t, addr)
		for _, err := range []error{
			want(t, fams, 1, "cellvisor_cell_ready", cell...),
			want(t, fams, 0, "cellvisor_cell_drained", cell...),
			want(t, fams, 1, "cellvisor_cell_state", append(cell, "state", "ready")...),
			want(t, fams, 0, "cellvisor_cell_state", append(cell, "state", "drained")...),
			want(t, fams, 0, "cellvisor_cell_restarts_total", append(cell, "kind", "crash")...),
			want(t, fams, 1, "cellvisor_cell_info", "cell", "cell-02", "pool", "quarantine-default", "assignment", "assigned"),
			want(t, fams, 1, "cellvisor_manifest_active_sequence"),
			want(t, fams, 1, "cellvisor_activation_last_outcome", "outcome", "applied"),
			want(t, fams, 1, "cellvisor_activations_total", "outcome", "applied"),
			want(t, fams, 1, "cellvisor_agent_enrollment_state", "state", "spool"),
			want(t, fams, 0, "cellvisor_ack_journal_pending"),
			want(t, fams, 1, "cellvisor_cell_report_ok", cell...),
			want(t, fams, float64(cfg.Limits.Memory), "cellvisor_cell_memory_limit_bytes", cell...),
			want(t, fams, float64(cfg.Limits.PIDs), "cellvisor_cell_pids_limit", cell...),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
	if d, err := value(fams, "cellvisor_activation_last_duration_seconds"); err != nil || d <= 0 || d > 60 {
		t.Errorf("last activation duration %g s (%v), want within (0, 60]", d, err)
	}
	if n, err := value(fams, "cellvisor_cell_requests_total", cell...); err != nil || n < 1 {
		t.Errorf("requests %g (%v): awaitBody made at least one", n, err)
	}
	// CPU time is read on v2 and on hybrid hosts alike (it read 0 on v1
	// before cells joined the cpuacct hierarchy): a started nginx used some.
	if n, err := value(fams, "cellvisor_cell_cpu_seconds_total", cell...); err != nil || n <= 0 {
		t.Errorf("cpu seconds %g (%v), want > 0", n, err)
	}
	if n, err := value(fams, "cellvisor_cell_pids", cell...); err != nil || n < 2 {
		t.Errorf("pids %g (%v): a master and a worker at least", n, err)
	}
	checkMetricsWithPromtool(t, body)

	st, err := adminsock.FetchStatus(context.Background(), agent.AdminSocket(cfg))
	if err != nil {
		t.Fatal(err)
	}
	memoryMatchesTheCgroupFile(t, addr, st)

	// A killed master is a crash: the counter rises by one and the cell
	// is ready again.
	pid := st.Slots[0].PID
	if pid == 0 {
		t.Fatal("cell-01 has no pid")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		now, err := adminsock.FetchStatus(ctx, agent.AdminSocket(cfg))
		if err != nil {
			return err
		}
		if s := now.Slots[0]; s.PID == pid || s.State != supervisor.StateReady {
			return fmt.Errorf("cell-01 is %s with pid %d (killed %d)", s.State, s.PID, pid)
		}
		_, fams = scrape(t, addr)
		if err := want(t, fams, 1, "cellvisor_cell_restarts_total", append(cell, "kind", "crash")...); err != nil {
			return err
		}
		if err := want(t, fams, 1, "cellvisor_cell_ready", cell...); err != nil {
			return err
		}
		// Its private endpoint answers too (a drain goes there).
		return want(t, fams, 1, "cellvisor_cell_report_ok", cell...)
	})
	if err := want(t, fams, 0, "cellvisor_cell_restarts_total", append(cell, "kind", "operator")...); err != nil {
		t.Error(err)
	}

	// Drained: the drained gauge flips at once (drain returns once the
	// cell took it), the state series once the slot's routine has seen it.
	if out, err := exec.Command(bin, "--config", cfgPath, "drain", "cell-01").CombinedOutput(); err != nil {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	_, fams = scrape(t, addr)
	if err := want(t, fams, 1, "cellvisor_cell_drained", cell...); err != nil {
		t.Error(err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		_, fams = scrape(t, addr)
		for _, err := range []error{
			want(t, fams, 1, "cellvisor_cell_drained", cell...),
			want(t, fams, 0, "cellvisor_cell_ready", cell...),
			want(t, fams, 1, "cellvisor_cell_state", append(cell, "state", "drained")...),
			want(t, fams, 0, "cellvisor_cell_state", append(cell, "state", "ready")...),
			want(t, fams, 1, "cellvisor_cell_ready", "cell", "cell-02", "pool", "quarantine-default"),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// memoryMatchesTheCgroupFile: the memory a scrape reports was read from
// the cgroup's file between two reads of that file by the test, so it lies
// between them when memory moved one way in between. Memory may also move
// up and back (the scrape itself makes the cell answer a status call), so
// a scrape out of bounds is retried; a collector that read anything else
// (another file, another cell, a stale value) fails every time.
func memoryMatchesTheCgroupFile(t *testing.T, addr string, st supervisor.Status) {
	t.Helper()
	s := st.Slots[0]
	file := filepath.Join("/sys/fs/cgroup", s.CgroupPaths["unified"], "memory.current")
	if st.CgroupMode == cgroup.ModeV1Hybrid {
		file = filepath.Join("/sys/fs/cgroup", "memory", s.CgroupPaths["memory"], "memory.usage_in_bytes")
	}
	read := func() float64 {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return float64(n)
	}
	cell := []string{"cell", s.Name, "pool", s.Pool}
	testutil.Eventually(t, 10*time.Second, func() error {
		before := read()
		_, fams := scrape(t, addr)
		after := read()
		got, err := value(fams, "cellvisor_cell_memory_bytes", cell...)
		if err != nil {
			return err
		}
		if lo, hi := min(before, after), max(before, after); got < lo || got > hi {
			return fmt.Errorf("memory %g, the file read %g before and %g after the scrape", got, before, after)
		}
		return nil
	})
}

// checkMetricsWithPromtool runs promtool check metrics (the exposition
// format and naming conventions) on a scrape.
func checkMetricsWithPromtool(t *testing.T, body string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Logf("promtool check metrics skipped: promtool not found (make deps installs Debian's prometheus package)")
		return
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
