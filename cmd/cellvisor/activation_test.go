package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/config"
	"cellvisor/controlclient"
	"cellvisor/manifest"
	"cellvisor/runtime"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

const spoolEdge = "8d1f6c1e-3a52-4c9a-b7f0-2e6d9a0c4b11"

// spool is a control plane's side of a manifest spool, with its signing key.
type spool struct {
	src  controlclient.DirSource
	priv ed25519.PrivateKey
}

// newSpool makes a spool and the agent identity that pins its key.
func newSpool(t testing.TB, cfg config.Agent, dir string) *spool {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := json.Marshal(agent.Identity{EdgeID: spoolEdge, ControlPublicKey: base64.StdEncoding.EncodeToString(pub)})
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Identity(), id, 0o600); err != nil {
		t.Fatal(err)
	}
	return &spool{src: controlclient.DirSource{Dir: dir}, priv: priv}
}

// publish signs and publishes sequence seq: app.test in shared-default
// answering body, plus n filler domains.
func (s *spool) publish(t testing.TB, seq int64, body string, n int, tamper bool) {
	t.Helper()
	m := manifest.Manifest{EdgeID: spoolEdge, Sequence: seq}
	arts := map[string][]byte{}
	add := func(domain, body string) {
		art := []byte(fmt.Sprintf(`{"domain":%q,"pool":"shared-default","revision":%d,"hostnames":[%q],"routes":[{"prefix":"/","respond":{"status":200,"body":%q}}]}`,
			domain, seq, domain, body))
		e := manifest.NewEntry(s.priv, spoolEdge, domain, "shared-default", seq, art)
		if tamper && domain == "app.test" {
			art = []byte(string(art[:len(art)-3]) + "!}]}")
		}
		arts[e.SHA256] = art
		m.Entries = append(m.Entries, e)
	}
	add("app.test", body)
	for i := 0; i < n; i++ {
		add(fmt.Sprintf("filler%d.test", i), "filler")
	}
	if err := s.src.Publish(manifest.Sign(s.priv, m, nil), arts); err != nil {
		t.Fatal(err)
	}
}

func appBody(port int) (string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+"/", nil)
	req.Host = "app.test"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req.WithContext(ctx))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), err
}

func awaitBody(t testing.TB, port int, want string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() error {
		got, err := appBody(port)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("cell answers %q, want %q", got, want)
		}
		return nil
	})
}

func awaitAck(t testing.TB, s *spool, seq int64, status string) manifest.Ack {
	t.Helper()
	var a manifest.Ack
	testutil.Eventually(t, 30*time.Second, func() error {
		acks, err := s.src.Acks()
		if err != nil {
			return err
		}
		var ok bool
		if a, ok = acks[seq]; !ok || a.Status != status {
			return fmt.Errorf("ack of %d: %+v", seq, a)
		}
		return nil
	})
	return a
}

// spoolAgent is an agent of two slots fed from a spool, started once it
// serves sequence 1 (app.test answering "v1", with fillers filler domains)
// and has acknowledged it.
type spoolAgent struct {
	bin, cfgPath, spoolDir string
	cfg                    config.Agent
	sp                     *spool
	a                      *runningAgent
	port                   int // cell-01's
}

// startSpoolAgent starts a spoolAgent; source holds settings of its
// source beyond its directory, poll interval and backoff.
func startSpoolAgent(t *testing.T, source string, fillers int) *spoolAgent {
	t.Helper()
	testutil.RequireRoot(t)
	r := &spoolAgent{bin: buildAgent(t), spoolDir: filepath.Join(t.TempDir(), "spool")}
	r.cfgPath, r.cfg = agentConfig(t, 2, fmt.Sprintf("source:\n  dir: %s\n  poll_interval: 100ms\n  max_backoff: 500ms\n%s", r.spoolDir, source))
	r.sp = newSpool(t, r.cfg, r.spoolDir)
	r.sp.publish(t, 1, "v1", fillers, false)
	var st supervisor.Status
	r.a, st = startAgent(t, r.bin, r.cfgPath, r.cfg)
	r.port = st.Slots[0].HTTPPort
	awaitBody(t, r.port, "v1")
	awaitAck(t, r.sp, 1, manifest.AckApplied)
	return r
}

// Signed manifests reach the cell and are acknowledged; a tampered one is
// refused while the previous release keeps serving; with its source gone, a
// restarted agent serves from disk, and from the previous release when the
// active one is damaged.
func TestManifestsReachCellsThroughTheAgent(t *testing.T) {
	r := startSpoolAgent(t, "", 3)
	bin, cfgPath, cfg, spoolDir, sp, a, port := r.bin, r.cfgPath, r.cfg, r.spoolDir, r.sp, r.a, r.port
	pid := mustStatus(t, cfg).Slots[0].PID

	sp.publish(t, 2, "v2", 3, false)
	awaitBody(t, port, "v2")
	awaitAck(t, sp, 2, manifest.AckApplied)
	if now := mustStatus(t, cfg).Slots[0]; now.PID != pid || now.Restarts != 0 {
		t.Errorf("a new revision restarted the cell (pid %d → %d): it should reload", pid, now.PID)
	}

	sp.publish(t, 3, "v3", 3, true)
	ack := awaitAck(t, sp, 3, manifest.AckRefused)
	t.Logf("refusal ack: %s", ack.Reason)
	if got, err := appBody(port); err != nil || got != "v2" {
		t.Errorf("after a refused manifest the cell answers %q %v, want v2", got, err)
	}
	if c := mustStatus(t, cfg).Control; c == nil || c.ActiveSequence != 2 {
		t.Errorf("control status %+v, want active sequence 2", c)
	}
	a.stop(t)

	// Offline: the spool is gone; the cells serve the last verified release.
	if err := os.Rename(spoolDir, spoolDir+".away"); err != nil {
		t.Fatal(err)
	}
	a, _ = startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, port, "v2")
	testutil.Eventually(t, 10*time.Second, func() error {
		if c := mustStatus(t, cfg).Control; c == nil || c.LastPollError == "" {
			return fmt.Errorf("status does not show the unreachable source: %+v", c)
		}
		return nil
	})
	a.stop(t)

	// The active release is damaged on disk: the agent rolls back to the
	// previous one instead of serving a damaged one.
	slot, _ := runtime.Plan(runtime.Layout{Slots: 2, HTTPBase: cfg.Ports.HTTPBase, HTTPSBase: cfg.Ports.HTTPSBase, StateDir: cfg.StateDir, RunDir: cfg.RunDir}).Slot("cell-01")
	if err := os.WriteFile(filepath.Join(slot.RuntimeDir(), "current", "pools", "shared-default.json"), []byte(`{"hosts":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, port, "v1")
}

func mustStatus(t testing.TB, cfg config.Agent) supervisor.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := adminsock.FetchStatus(ctx, agent.AdminSocket(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// An enrolled agent whose only release of a cell is damaged never starts
// the cell on it: it withdraws the release, fetches it again from its
// source, and the cell answers once it is whole. Every answer the cell
// gives meanwhile is the published one.
func TestDamagedReleaseWithNothingToRollBackToIsFetchedAgain(t *testing.T) {
	r := startSpoolAgent(t, "", 3)
	cfg, port := r.cfg, r.port
	r.a.stop(t)

	slot, _ := runtime.Plan(runtime.Layout{Slots: 2, HTTPBase: cfg.Ports.HTTPBase, HTTPSBase: cfg.Ports.HTTPSBase, StateDir: cfg.StateDir, RunDir: cfg.RunDir}).Slot("cell-01")
	if err := os.WriteFile(filepath.Join(slot.RuntimeDir(), "current", "pools", "shared-default.json"), []byte(`{"hosts":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	answers := make(chan string, 1)
	go func() { answers <- watchAnswers(ctx, port, "v1") }()
	t.Cleanup(cancel)
	startAgent(t, r.bin, r.cfgPath, cfg)
	awaitBody(t, port, "v1")
	cancel()
	if other := <-answers; other != "" {
		t.Errorf("the cell answered %s before its release was fetched again: it started on the damaged one", other)
	}
}

// watchAnswers asks the cell on port for app.test every few milliseconds
// until ctx ends, and returns the first answer other than a 200 with want
// ("" if none). No answer (refused, reset) is not one.
func watchAnswers(ctx context.Context, port int, want string) string {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+"/", nil)
		req.Host = "app.test"
		if resp, err := client.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(b) != want {
				return fmt.Sprintf("%s %q", resp.Status, b)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
	return ""
}
