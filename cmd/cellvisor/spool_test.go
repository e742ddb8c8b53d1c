package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// artifactOf is the spool path of app.test's artifact in sequence seq.
func (s *spool) artifactOf(t testing.TB, seq int64) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.src.Dir, "manifests", strconv.FormatInt(seq, 10), "0.json"))
	if err != nil {
		t.Fatal(err)
	}
	var p manifest.Page
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	for _, e := range p.Entries {
		if e.Domain == "app.test" {
			return filepath.Join(s.src.Dir, "artifacts", e.SHA256)
		}
	}
	t.Fatal("no app.test entry")
	return ""
}

func replaceWith(t testing.TB, path string, make func(string) error) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := make(path); err != nil {
		t.Fatal(err)
	}
}

// A hostile spool: a page that links to /dev/zero, an artifact that is a
// FIFO, one that is a sparse file of 64 GiB, and a crafted page whose
// refusal would quote megabytes. Each is refused with its reason, nothing
// is activated, the active release keeps serving, and the agent restarts
// with the refusal still in its journal (its ack undeliverable), then
// applies the next good manifest. Before, the link and the sparse file grew
// the agent until the kernel killed it, the FIFO hung the poll forever, and
// the crafted page left a journal the agent refused to start with.
func TestHostileSpoolIsRefusedAndTheAgentKeepsServing(t *testing.T) {
	r := startSpoolAgent(t, "  poll_timeout: 20s\n", 2)
	bin, cfgPath, cfg, spoolDir, sp, a, port := r.bin, r.cfgPath, r.cfg, r.spoolDir, r.sp, r.a, r.port

	still := func(what string) {
		t.Helper()
		if got, err := appBody(port); err != nil || got != "v1" {
			t.Errorf("after %s the cell answers %q %v, want v1", what, got, err)
		}
		if c := mustStatus(t, cfg).Control; c == nil || c.ActiveSequence != 1 {
			t.Errorf("after %s control status %+v, want active sequence 1", what, c)
		}
	}
	// A page that cannot be read is refused before its sequence is known:
	// the ack carries sequence 0, and its reason names the file.
	sp.publish(t, 2, "v2", 2, false)
	replaceWith(t, filepath.Join(spoolDir, "manifests", "2", "0.json"), func(p string) error { return os.Symlink("/dev/zero", p) })
	ack := awaitAck(t, sp, 0, manifest.AckRefused)
	if !strings.Contains(ack.Reason, "manifests/2/0.json is not a regular file") {
		t.Errorf("page linked to /dev/zero: reason %q", ack.Reason)
	}
	still("a page linked to /dev/zero")

	sp.publish(t, 3, "v3", 2, false)
	replaceWith(t, sp.artifactOf(t, 3), func(p string) error { return syscall.Mkfifo(p, 0o644) })
	if ack := awaitAck(t, sp, 3, manifest.AckRefused); !strings.Contains(ack.Reason, "is not a regular file") {
		t.Errorf("artifact that is a FIFO: reason %q", ack.Reason)
	}
	still("an artifact that is a FIFO")

	sp.publish(t, 4, "v4", 2, false)
	replaceWith(t, sp.artifactOf(t, 4), func(p string) error {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Truncate(64 << 30)
	})
	if ack := awaitAck(t, sp, 4, manifest.AckRefused); !strings.Contains(ack.Reason, "over") {
		t.Errorf("sparse artifact of 64 GiB: reason %q", ack.Reason)
	}
	still("a sparse artifact of 64 GiB")

	// The crafted page, with acks undeliverable (acks/ is a file): its
	// refusal stays in the journal across a restart.
	if err := os.RemoveAll(filepath.Join(spoolDir, "acks")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spoolDir, "acks"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	evil := strings.Repeat("a", 3<<20) + "\x1b[2J"
	quoted, _ := json.Marshal(evil)
	// A forged header gets it past the check that a header is there, to
	// where its entries are validated and the domain quoted.
	page := fmt.Sprintf(`{"edge_id":%[1]q,"sequence":5,"header":{"edge_id":%[1]q,"sequence":5,"entries":1,"entries_digest":"x","assignments_digest":""},"header_signature":"x",`+
		`"entries":[{"domain":%[2]s,"pool":"shared-default","revision":1,"size":1,"sha256":"x","signature":"x"}]}`, spoolEdge, quoted)
	if err := os.MkdirAll(filepath.Join(spoolDir, "manifests", "5"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spoolDir, "manifests", "5", "0.json"), []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if c := mustStatus(t, cfg).Control; c == nil || c.PendingAcks == 0 {
			return fmt.Errorf("no pending ack yet: %+v", c)
		}
		return nil
	})
	still("a crafted page")
	a.stop(t)
	a, _ = startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, port, "v1")
	if c := mustStatus(t, cfg).Control; c == nil || c.PendingAcks == 0 || c.DroppedAcks != 0 {
		t.Errorf("after a restart: control status %+v, want the refusal still pending, nothing dropped", c)
	}
	os.Remove(filepath.Join(spoolDir, "acks"))
	ack = awaitAck(t, sp, 5, manifest.AckRefused)
	if len(ack.Reason) > manifest.MaxReasonBytes || strings.Contains(ack.Reason, "\x1b") || !strings.Contains(ack.Reason, "not a valid hostname") {
		t.Errorf("crafted page: reason of %d bytes %q", len(ack.Reason), ack.Reason[:min(len(ack.Reason), 120)])
	}

	// The next good manifest is applied.
	sp.publish(t, 6, "v6", 2, false)
	awaitBody(t, port, "v6")
	awaitAck(t, sp, 6, manifest.AckApplied)
	a.stop(t)
}
