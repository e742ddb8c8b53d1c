package activation

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"cellvisor/controlclient"
	"cellvisor/domain"
	"cellvisor/manifest"
)

// spoolRig is a rig fed from a real spool directory.
type spoolRig struct {
	*rig
	spool controlclient.DirSource
}

func newSpoolRig(t *testing.T) *spoolRig {
	r := newRig(t)
	spool := controlclient.DirSource{Dir: t.TempDir()}
	r.a.o.Source = spool
	return &spoolRig{rig: r, spool: spool}
}

// entry signs an artifact of name at rev with body, marked rollback or not.
func (r *spoolRig) entry(priv ed25519.PrivateKey, name string, rev int64, body string, rollback bool) manifest.Entry {
	art := domainJSON(name, domain.PoolSharedDefault, rev, body)
	e := manifest.NewEntry(priv, edge, name, domain.PoolSharedDefault, rev, art)
	if rollback {
		e.Rollback = true
		e = resign(priv, e)
	}
	if err := os.MkdirAll(filepath.Join(r.spool.Dir, "artifacts"), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.spool.Dir, "artifacts", e.SHA256), art, 0o644); err != nil {
		r.t.Fatal(err)
	}
	return e
}

// writePages puts pages into the spool as sequence seq, bypassing
// Publish's checks, as anyone who can write the spool can.
func (r *spoolRig) writePages(seq int64, pages ...manifest.Page) {
	dir := filepath.Join(r.spool.Dir, "manifests", strconv.FormatInt(seq, 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	for i, p := range pages {
		data, _ := json.Marshal(p)
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)+".json"), data, 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
}

func (r *spoolRig) poll() {
	r.t.Helper()
	if err := r.a.Poll(context.Background()); err != nil {
		r.t.Fatal(err)
	}
}

// refused asserts that seq was refused for why, acked, and that sequence
// active still serves body.
func (r *spoolRig) refused(seq int64, why string, active int64, body string) {
	r.t.Helper()
	a := r.lastAck()
	if a.Sequence != seq || a.Status != manifest.AckRefused || !strings.Contains(a.Reason, why) {
		r.t.Errorf("ack %+v, want sequence %d refused for %q", a, seq, why)
	}
	if r.a.Active() != active || !strings.Contains(r.poolJSON("cell-01"), body) {
		r.t.Errorf("active %d serving %q, want %d still serving %q", r.a.Active(), r.poolJSON("cell-01"), active, body)
	}
}

func (r *spoolRig) publishSigned(priv ed25519.PrivateKey, seq int64, rotations []manifest.Rotation, entries ...manifest.Entry) {
	r.t.Helper()
	m := manifest.Sign(priv, manifest.Manifest{EdgeID: edge, Sequence: seq, Entries: entries}, rotations)
	if err := r.spool.Publish(m, nil); err != nil {
		r.t.Fatal(err)
	}
}

// Without the key, whoever writes the spool can neither empty the edge,
// nor replay old entries under a new sequence, nor drop some, nor jump the
// sequence out of reach.
func TestForgedManifestsRefused(t *testing.T) {
	r := newSpoolRig(t)
	a1, b1 := r.entry(r.priv, "a.example.com", 1, "a one", false), r.entry(r.priv, "b.example.com", 1, "b one", false)
	r.publishSigned(r.priv, 1, nil, a1, b1)
	r.poll()
	if r.a.Active() != 1 || !strings.Contains(r.poolJSON("cell-01"), "a one") {
		t.Fatalf("active %d", r.a.Active())
	}
	good := manifest.Sign(r.priv, manifest.Manifest{EdgeID: edge, Sequence: 1, Entries: []manifest.Entry{a1, b1}}, nil)
	attacker := namedKey(t, "attacker")

	// An empty manifest with no header.
	r.writePages(2, manifest.Page{EdgeID: edge, Sequence: 2, Entries: []manifest.Entry{}})
	r.poll()
	r.refused(2, "no signed header", 1, "a one")

	// An empty manifest signed by another key.
	r.writePages(3, manifest.Paginate(manifest.Sign(attacker, manifest.Manifest{EdgeID: edge, Sequence: 3}, nil), 500)...)
	r.poll()
	r.refused(3, "not signed by the pinned", 1, "a one")

	// The signed entries and header of sequence 1 re-served as sequence 4.
	replay := good
	replay.Sequence = 4
	r.writePages(4, manifest.Paginate(replay, 500)...)
	r.poll()
	r.refused(4, "header for sequence 1", 1, "a one")

	// One entry dropped from a genuinely signed manifest.
	full := manifest.Sign(r.priv, manifest.Manifest{EdgeID: edge, Sequence: 5, Entries: []manifest.Entry{a1, b1}}, nil)
	dropped := full
	dropped.Entries = full.Entries[1:]
	r.writePages(5, manifest.Paginate(dropped, 500)...)
	r.poll()
	r.refused(5, "header says 2 entries", 1, "a one")

	// A sequence out of every bound: malformed, acked without a sequence.
	r.writePages(math.MaxInt64, manifest.Paginate(manifest.Sign(attacker, manifest.Manifest{EdgeID: edge, Sequence: math.MaxInt64}, nil), 500)...)
	r.poll()
	r.refused(0, "is not 1–9007199254740991", 1, "a one")
	os.RemoveAll(filepath.Join(r.spool.Dir, "manifests", strconv.FormatInt(math.MaxInt64, 10)))

	// A forged manifest at the next sequence does not hide the real one.
	r.writePages(6, manifest.Paginate(manifest.Sign(attacker, manifest.Manifest{EdgeID: edge, Sequence: 6}, nil), 500)...)
	r.poll()
	r.refused(6, "not signed by the pinned", 1, "a one")
	os.RemoveAll(filepath.Join(r.spool.Dir, "manifests", "6"))
	a2 := r.entry(r.priv, "a.example.com", 2, "a two", false)
	r.publishSigned(r.priv, 6, nil, a2, b1)
	r.poll()
	if a := r.lastAck(); a.Sequence != 6 || a.Status != manifest.AckApplied || r.a.Active() != 6 || !strings.Contains(r.poolJSON("cell-01"), "a two") {
		t.Errorf("the real sequence 6 after a forged one: ack %+v, active %d", a, r.a.Active())
	}

	// An empty manifest, signed, is applied like any other.
	r.publishSigned(r.priv, 7, nil)
	r.poll()
	if r.a.Active() != 7 || strings.Contains(r.poolJSON("cell-01"), "a two") {
		t.Errorf("signed empty manifest: active %d, cell-01 %q", r.a.Active(), r.poolJSON("cell-01"))
	}
}

// A revision never goes backwards without a signed rollback, across
// restarts of the agent.
func TestRevisionsNeverGoBackwards(t *testing.T) {
	r := newSpoolRig(t)
	r.publishSigned(r.priv, 1, nil, r.entry(r.priv, "a.example.com", 5, "rev five", false))
	r.poll()
	r.publishSigned(r.priv, 2, nil, r.entry(r.priv, "a.example.com", 3, "rev three", false))
	r.poll()
	r.refused(2, "a.example.com revision 3, active 5", 1, "rev five")

	r.publishSigned(r.priv, 3, nil, r.entry(r.priv, "a.example.com", 3, "rev three", true))
	r.poll()
	if r.a.Active() != 3 || !strings.Contains(r.poolJSON("cell-01"), "rev three") {
		t.Fatalf("signed rollback: active %d, %q", r.a.Active(), r.poolJSON("cell-01"))
	}
	// The floor is now 3, and survives a restart of the agent.
	restarted, err := New(r.a.o)
	if err != nil {
		t.Fatal(err)
	}
	r.a = restarted
	r.publishSigned(r.priv, 4, nil, r.entry(r.priv, "a.example.com", 2, "rev two", false))
	r.poll()
	r.refused(4, "a.example.com revision 2, active 3", 3, "rev three")
	// A rollback flag set by the spool's writer, not signed, is refused.
	forged := r.entry(r.priv, "a.example.com", 2, "rev two", false)
	forged.Rollback = true
	m := manifest.Sign(r.priv, manifest.Manifest{EdgeID: edge, Sequence: 5, Entries: []manifest.Entry{forged}}, nil)
	r.writePages(5, manifest.Paginate(m, 500)...)
	r.poll()
	r.refused(5, "signature", 3, "rev three")
}

// A rotation announced by the old key and the new one moves the pin, which
// survives a restart; the old key is refused from then on.
func TestKeyRotationPinsTheNewKey(t *testing.T) {
	r := newSpoolRig(t)
	k1 := namedKey(t, "k1")
	r.publishSigned(r.priv, 1, nil, r.entry(r.priv, "a.example.com", 1, "one", false))
	r.poll()
	rot := []manifest.Rotation{manifest.NewRotation(r.priv, k1)}
	r.publishSigned(k1, 2, rot, r.entry(k1, "a.example.com", 2, "two", false))
	r.poll()
	if r.a.Active() != 2 || !r.a.PinnedKey().Equal(k1.Public()) {
		t.Fatalf("after the rotation: active %d, pinned the new key: %v", r.a.Active(), r.a.PinnedKey().Equal(k1.Public()))
	}
	restarted, err := New(r.a.o)
	if err != nil {
		t.Fatal(err)
	}
	r.a = restarted
	if !r.a.PinnedKey().Equal(k1.Public()) {
		t.Fatal("the pin did not survive a restart")
	}
	// The old key, even with its entries re-signed, is refused now.
	r.publishSigned(r.priv, 3, nil, r.entry(r.priv, "a.example.com", 3, "three", false))
	r.poll()
	r.refused(3, "not signed by the pinned", 2, "two")
	// Entries signed by the old key under a header of the new one, too.
	r.publishSigned(k1, 4, rot, r.entry(r.priv, "a.example.com", 4, "four", false))
	r.poll()
	r.refused(4, "signature", 2, "two")
	r.publishSigned(k1, 5, rot, r.entry(k1, "a.example.com", 5, "five", false))
	r.poll()
	if r.a.Active() != 5 || !strings.Contains(r.poolJSON("cell-01"), "five") {
		t.Errorf("new key after restart: active %d", r.a.Active())
	}
}

// A snapshot is authenticated like a manifest: one whose header is missing
// or does not cover its entries is refused.
func TestSnapshotHeaderVerified(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(m *manifest.Manifest)
		why    string
	}{
		{"no header", func(m *manifest.Manifest) { m.Header, m.HeaderSignature = manifest.Header{}, "" }, "no signed header"},
		{"an entry dropped", func(m *manifest.Manifest) { m.Entries = m.Entries[1:] }, "header says 2 entries"},
		{"empty, forged", func(m *manifest.Manifest) {
			*m = manifest.Sign(namedKey(t, "attacker"), manifest.Manifest{EdgeID: edge, Sequence: 5}, nil)
		}, "not signed by the pinned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newSpoolRig(t)
			a, b := r.entry(r.priv, "a.example.com", 1, "one", false), r.entry(r.priv, "b.example.com", 1, "b", false)
			m := manifest.Sign(r.priv, manifest.Manifest{EdgeID: edge, Sequence: 5, Entries: []manifest.Entry{a, b}}, nil)
			tc.tamper(&m)
			arts := map[string][]byte{} // what the tampered manifest names: no stray artifact
			for _, e := range m.Entries {
				arts[e.SHA256], _ = r.spool.Artifact(context.Background(), e.SHA256)
			}
			f, err := os.Create(filepath.Join(r.spool.Dir, "snapshot.tar.gz"))
			if err != nil {
				t.Fatal(err)
			}
			if err := manifest.WriteSnapshot(f, manifest.Snapshot{Manifest: m, Artifacts: arts}); err != nil {
				t.Fatal(err)
			}
			f.Close()
			os.MkdirAll(filepath.Join(r.spool.Dir, "manifests"), 0o755)
			r.poll()
			if a := r.lastAck(); a.Status != manifest.AckRefused || !strings.Contains(a.Reason, tc.why) || r.a.Active() != 0 || r.poolJSON("cell-01") != "" {
				t.Errorf("ack %+v, active %d", a, r.a.Active())
			}
		})
	}
}

func namedKey(t testing.TB, name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte(t.Name() + "/" + name))
	return ed25519.NewKeyFromSeed(seed[:])
}
