package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/config"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// install puts src at dst as a package upgrade does: written beside it,
// then renamed over it, so running processes keep the old file.
func install(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst+".dpkg-new", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dst+".dpkg-new", dst); err != nil {
		t.Fatal(err)
	}
}

// The sequence: cells serving under the agent, the binary replaced
// as a package upgrade replaces it, the agent killed (-9) and started again.
// The new agent adopts every cell with the same master; under
// runtime_upgrade: manual, upgrade-runtime --dry-run says what would happen
// and changes nothing, upgrade-runtime rolls each cell onto the new binary
// with nginx's own binary upgrade (the masters' parent is no longer the
// agent that started them): under a steady stream of requests none fails,
// and each cell ends with a master executing the new file.
func TestRuntimeUpgradeAfterAgentKill(t *testing.T) {
	testutil.RequireCgroups(t)
	nginx, _ := testutil.RequireOpenResty(t)
	dir := t.TempDir()
	testutil.Traversable(t, dir)
	copyBin := filepath.Join(dir, "nginx")
	install(t, nginx, copyBin)
	bin := buildAgent(t)
	cfgPath, _ := agentConfig(t, 2, "runtime_upgrade: manual\n")
	// A route that streams from a loopback origin until released.
	release := make(chan struct{})
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Accel-Buffering", "no")
		io.WriteString(w, "start\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "end\n")
	}))
	t.Cleanup(origin.Close)
	doc := fmt.Sprintf(`{"domain":"app.test","pool":"shared-default","revision":1,"hostnames":["app.test"],"origins":[{"name":"o","url":%q}],"routes":[{"prefix":"/stream","origin":"o"},{"prefix":"/","respond":{"status":200,"body":"hi"}}]}`, origin.URL)
	if err := os.WriteFile(filepath.Join(filepath.Dir(cfgPath), "domains", "app.json"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(string(raw), "binary: "+nginx, "binary: "+copyBin, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	a, st := startAgent(t, bin, cfgPath, cfg)
	pids := readyPIDs(st)
	if len(pids) != 2 {
		t.Fatalf("ready cells %v, want two", pids)
	}
	var ports []int
	for _, s := range st.Slots {
		ports = append(ports, s.HTTPPort)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var s stream
	var wg sync.WaitGroup
	wg.Go(func() { s.run(ctx, ports) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	// A response streaming from cell-01 across the whole upgrade.
	var streamPort int
	for _, sl := range st.Slots {
		if sl.Name == "cell-01" {
			streamPort = sl.HTTPPort
		}
	}
	sreq, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(streamPort)+"/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	sreq.Host = "app.test"
	sresp, err := http.DefaultClient.Do(sreq)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	sbody := bufio.NewReader(sresp.Body)
	if line, err := sbody.ReadString('\n'); err != nil || line != "start\n" {
		t.Fatalf("stream: %q %v, want its first line", line, err)
	}

	install(t, nginx, copyBin)
	a.kill9(t)
	// The new agent adopts the same masters; the policy is manual: it
	// waits for the operator.
	a, st = startAgent(t, bin, cfgPath, cfg)
	if got := readyPIDs(st); !maps.Equal(got, pids) {
		t.Fatalf("ready masters %v, want the same %v adopted", got, pids)
	}
	dry := cliRun(t, bin, cfgPath, "upgrade-runtime", "--dry-run")
	if strings.Count(dry, supervisor.HowBinaryUpgrade) != 2 || !strings.Contains(dry, "dry run: nothing changed") {
		t.Errorf("upgrade-runtime --dry-run:\n%s\nwant both cells by nginx's binary upgrade, nothing changed", dry)
	}
	st = fetchStatus(t, cfg)
	if got := readyPIDs(st); !maps.Equal(got, pids) || st.Runtime.Superseded != 2 {
		t.Fatalf("after the dry run: masters %v, runtime %+v; want %v untouched, 2 superseded", got, *st.Runtime, pids)
	}
	if out := cliRun(t, bin, cfgPath, "upgrade-runtime"); !strings.Contains(out, "the roll has started") {
		t.Errorf("upgrade-runtime:\n%s\nwant the roll started", out)
	}
	testutil.Eventually(t, 60*time.Second, func() error {
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		defer scancel()
		st, err = adminsock.FetchStatus(sctx, agent.AdminSocket(cfg))
		if err != nil {
			return err
		}
		if r := st.Runtime; r == nil || r.Superseded != 0 || r.Upgrade != supervisor.UpgradeIdle {
			return fmt.Errorf("runtime %+v, want every cell rolled", r)
		}
		for _, sl := range st.Slots {
			if sl.State != supervisor.StateReady || sl.PID == pids[sl.Name] {
				return fmt.Errorf("%s: %s pid %d, want a new master ready", sl.Name, sl.State, sl.PID)
			}
		}
		return nil
	})
	// The stream is still served, by the old master's worker, which
	// finishes it before the old master goes.
	if !testutil.Alive(pids["cell-01"]) {
		t.Errorf("cell-01's old master %d gone with a response still streaming", pids["cell-01"])
	}
	close(release)
	if rest, err := io.ReadAll(sbody); err != nil || string(rest) != "end\n" {
		t.Errorf("stream across the upgrade: %q %v, want its end", rest, err)
	}
	// Twenty more requests to the new masters, then the count.
	rolled := s.sent.Load()
	testutil.Eventually(t, 10*time.Second, func() error {
		if n := s.sent.Load() - rolled; n < 20 {
			return fmt.Errorf("%d requests since the roll", n)
		}
		return nil
	})
	cancel()
	wg.Wait()
	if s.failed.Load() != 0 || s.sent.Load() < 40 {
		t.Errorf("%d of %d requests failed (first: %v)", s.failed.Load(), s.sent.Load(), s.firstErr)
	}
	t.Logf("%d requests across the agent kill and the roll, %d failed", s.sent.Load(), s.failed.Load())
	for _, sl := range st.Slots {
		exe, err := os.Readlink("/proc/" + strconv.Itoa(sl.PID) + "/exe")
		if err != nil || exe != copyBin {
			t.Errorf("%s: master %d runs %q (%v), want the new %s", sl.Name, sl.PID, exe, err, copyBin)
		}
		if sl.Restarts != 0 || sl.OperatorRestarts != 0 {
			t.Errorf("%s: restarts %d+%d, want the roll to restart nothing", sl.Name, sl.Restarts, sl.OperatorRestarts)
		}
		old := pids[sl.Name]
		testutil.Eventually(t, 30*time.Second, func() error {
			if testutil.Alive(old) {
				return fmt.Errorf("%s: the old master %d still runs", sl.Name, old)
			}
			return nil
		})
	}
	log := string(mustRead(t, a.log))
	if n := strings.Count(log, "cell runs the new binary (nginx binary upgrade)"); n != 2 || strings.Contains(log, "restarting the cell instead") {
		t.Errorf("%d cells rolled by nginx's binary upgrade, want 2 and no restart", n)
	}
}

// cliRun runs the agent binary's CLI with cfgPath and returns its output;
// a failure fails the test.
func cliRun(t *testing.T, bin, cfgPath string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"--config", cfgPath}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("cellvisor %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// fetchStatus asks the running agent for its status.
func fetchStatus(t *testing.T, cfg config.Agent) supervisor.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := adminsock.FetchStatus(ctx, agent.AdminSocket(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A new binary that passes its checks (-v, -t) but whose master does not
// come up: the agent, restarted after the package upgrade, tries nginx's
// binary upgrade on the first adopted cell, the new master exits, and
// every cell keeps its old master, serving; status says the roll failed
// and why.
func TestRuntimeUpgradeNotReadyKeepsTheOldMasters(t *testing.T) {
	testutil.RequireCgroups(t)
	nginx, _ := testutil.RequireOpenResty(t)
	dir := t.TempDir()
	testutil.Traversable(t, dir)
	copyBin := filepath.Join(dir, "nginx")
	install(t, nginx, copyBin)
	bin := buildAgent(t)
	cfgPath, _ := agentConfig(t, 2, "")
	raw := mustRead(t, cfgPath)
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(string(raw), "binary: "+nginx, "binary: "+copyBin, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	a, st := startAgent(t, bin, cfgPath, cfg)
	pids := readyPIDs(st)
	a.kill9(t)
	// Checks pass (the real binary answers them); a master exits at once.
	broken := filepath.Join(dir, "broken")
	script := fmt.Sprintf("#!/bin/sh\ncase \"$1\" in -v|-t) exec %s \"$@\";; esac\necho 'broken: cannot start' >&2\nexit 1\n", nginx)
	if err := os.WriteFile(broken, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(broken, copyBin); err != nil {
		t.Fatal(err)
	}
	_, st = startAgent(t, bin, cfgPath, cfg)
	testutil.Eventually(t, 60*time.Second, func() error {
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		defer scancel()
		st, err = adminsock.FetchStatus(sctx, agent.AdminSocket(cfg))
		if err != nil {
			return err
		}
		if r := st.Runtime; r == nil || r.Upgrade != supervisor.UpgradeFailed {
			return fmt.Errorf("runtime %+v, want the roll failed", r)
		}
		return nil
	})
	if r := st.Runtime; !strings.Contains(r.Reason, "cell-01") || r.Superseded != 2 {
		t.Errorf("runtime %+v, want the failed cell named and both cells still on the old binary", *r)
	}
	for _, sl := range st.Slots {
		if sl.PID != pids[sl.Name] || sl.State != supervisor.StateReady {
			t.Errorf("%s: %s pid %d, want the old master %d ready", sl.Name, sl.State, sl.PID, pids[sl.Name])
		}
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(sl.HTTPPort) + "/.cellvisor/ready")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("%s: readiness %v %v", sl.Name, resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
	}
}
