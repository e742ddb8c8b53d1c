package main

import (
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// Through the real control API over mutual TLS and the real agent with real
// cells: a rollback an operator asks for reaches the cell, a lower revision
// without it is refused, the signing key rotates without re-enrolling (an
// edge that missed two rotations follows the chain), and a manifest whose
// entries the database lost is refused, acked, and changes nothing.
func TestManifestAuthenticationEndToEnd(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	cfgPath, cfg := agentConfig(t, 2, "source:\n  poll_interval: 100ms\n  max_backoff: 400ms\n  status_interval: 200ms\n")
	created := c.enroll(t, bin, cfgPath, adminapi.EdgeRequest{Name: "auth", Org: "acme", Country: "NL", Continent: "EU", Slots: 2})
	id := created.Edge.ID
	enrolledKey := c.ep.PublicKey
	c.publish(t, "v1")
	c.publish(t, "v2")
	a, st := startAgent(t, bin, cfgPath, cfg)
	port := st.Slots[0].HTTPPort
	awaitBody(t, port, "v2")

	v2 := c.awaitEdge(t, id, "v2 acknowledged", func(v adminapi.EdgeView) bool { return v.ActiveSequence == v.Sequence && v.Sequence > 1 })

	// The operator rolls back to revision 1: marked, so the edge takes it.
	rb, err := c.admin.RollbackDomain(ctxT(t), "app.test", 1)
	if err != nil || rb.Domain.Revision != 1 || rb.EdgesPending != 1 {
		t.Fatalf("rollback: %+v, %v", rb, err)
	}
	awaitBody(t, port, "v1")
	c.awaitEdge(t, id, "the rollback acknowledged", func(v adminapi.EdgeView) bool {
		return v.ActiveSequence == v.Sequence && v.Sequence > v2.Sequence
	})
	if _, err := c.admin.RollbackDomain(ctxT(t), "app.test", 2); err == nil {
		t.Error("a rollback to a revision above the current one was taken")
	}
	// The next publish goes above every revision the domain had.
	if p := c.publish(t, "v3"); p.Domain.Revision != 3 {
		t.Fatalf("publish after a rollback got revision %d, want 3", p.Domain.Revision)
	}
	awaitBody(t, port, "v3")

	// Rotation: the edge pins the new key from the manifest announcing it.
	rot, err := c.admin.RotateKey(ctxT(t))
	if err != nil || rot.Previous != enrolledKey || rot.PublicKey == enrolledKey {
		t.Fatalf("rotate: %+v, %v", rot, err)
	}
	c.awaitEdge(t, id, "the rotation acknowledged", func(v adminapi.EdgeView) bool { return v.ActiveSequence == rot.Edges[id] })
	if got := pinnedKey(t, cfg.StateDir); got != rot.PublicKey {
		t.Fatalf("pinned %q, want the new key %q", got, rot.PublicKey)
	}
	c.publish(t, "v4")
	awaitBody(t, port, "v4")

	// An edge that is down through two rotations follows both.
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit %d", code)
	}
	for range 2 {
		if rot, err = c.admin.RotateKey(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	before := c.awaitEdge(t, id, "the rotations made", func(adminapi.EdgeView) bool { return true })
	c.publish(t, "v5")
	a, _ = startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, port, "v5")
	v5 := c.awaitEdge(t, id, "v5 acknowledged", func(v adminapi.EdgeView) bool {
		return v.ActiveSequence == v.Sequence && v.Sequence > before.Sequence
	})
	if got := pinnedKey(t, cfg.StateDir); got != rot.PublicKey {
		t.Fatalf("after two missed rotations pinned %q, want %q", got, rot.PublicKey)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit %d", code)
	}

	// A control API whose database lost an entry serves a manifest that
	// does not match its signed header: refused, acked, nothing changes.
	p6, err := c.admin.Publish(ctxT(t), "other.test", adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(
		`{"hostnames":["other.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"other"}}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	// Built by a poll made with the edge's identity (the agent is stopped),
	// so that there is an entry to lose.
	cl, err := controlclient.New(controlclient.Options{URL: c.ep.EdgeURL, Dir: cfg.IdentityDir()})
	if err != nil {
		t.Fatal(err)
	}
	page, err := cl.Page(ctxT(t), v5.Sequence, "")
	cl.CloseIdle()
	if err != nil || p6.EdgesPending != 1 || page.Sequence != v5.Sequence+1 {
		t.Fatalf("poll after publishing other.test: sequence %d, %v (publish %+v)", page.Sequence, err, p6)
	}
	seq := page.Sequence
	db, err := sql.Open("sqlite", filepath.Join(c.data, "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`DELETE FROM manifest_entries WHERE edge_id = ? AND domain = 'other.test'`, id); err != nil {
		t.Fatal(err)
	}
	a, _ = startAgent(t, bin, cfgPath, cfg)
	v := c.awaitEdge(t, id, "the refusal acknowledged", func(v adminapi.EdgeView) bool {
		return len(v.Acks) > 0 && v.Acks[0].Sequence == seq
	})
	if ack := v.Acks[0]; ack.Status != manifest.AckRefused || !strings.Contains(ack.Reason, "header says 2 entries") || v.ActiveSequence != v5.Sequence {
		t.Fatalf("ack %+v, active %d", ack, v.ActiveSequence)
	}
	if got, err := appBody(port); err != nil || got != "v5" {
		t.Fatalf("after the refusal cell-01 answers %q, %v", got, err)
	}
	if ctl := mustStatus(t, cfg).Control; ctl == nil || ctl.ActiveSequence != v5.Sequence {
		t.Fatalf("status control %+v", ctl)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit %d", code)
	}
}

func pinnedKey(t *testing.T, stateDir string) string {
	t.Helper()
	var got struct{ Key string }
	var data []byte
	testutil.Eventually(t, 10*time.Second, func() error {
		var err error
		data, err = os.ReadFile(filepath.Join(stateDir, "pinned-key.json"))
		return err
	})
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if k, err := base64.StdEncoding.DecodeString(got.Key); err != nil || len(k) != 32 {
		t.Fatalf("pinned key %q", got.Key)
	}
	return got.Key
}
