package controlclient

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/manifest"
)

// spoolOf publishes a one-entry manifest at seq into a new spool.
func spoolOf(t testing.TB, seq int64) (DirSource, manifest.Entry) {
	t.Helper()
	_, priv, _ := ed25519.GenerateKey(nil)
	art := []byte(`{"domain":"a.example.com"}`)
	e := manifest.NewEntry(priv, "edge", "a.example.com", "shared-default", 1, art)
	d := DirSource{Dir: t.TempDir()}
	m := manifest.Sign(priv, manifest.Manifest{EdgeID: "edge", Sequence: seq, Entries: []manifest.Entry{e}}, nil)
	if err := d.Publish(m, map[string][]byte{e.SHA256: art}); err != nil {
		t.Fatal(err)
	}
	return d, e
}

// replace puts what make creates at path instead of the file there.
func replace(t testing.TB, path string, make func(string) error) {
	t.Helper()
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := make(path); err != nil {
		t.Fatal(err)
	}
}

func sparse(size int64) func(string) error {
	return func(p string) error {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Truncate(size)
	}
}

func symlink(target string) func(string) error {
	return func(p string) error { return os.Symlink(target, p) }
}

func fifo(p string) error { return syscall.Mkfifo(p, 0o600) }

// Pages, artifacts and the snapshot of a spool are refused, unread, when
// they are links (to /dev/zero or to a good file), FIFOs, devices or larger
// than their bound, and the reason names the file; none of it hangs or
// grows the agent. Before, a FIFO hung the poll forever and a link to
// /dev/zero read until the kernel killed the agent.
func TestSpoolRefusesAnythingButBoundedRegularFiles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		make  func(string) error
		want  error
		words string
	}{
		{"link to /dev/zero", symlink("/dev/zero"), manifest.ErrInvalid, "not a regular file"},
		{"link to a good file", symlink("/etc/hostname"), manifest.ErrInvalid, "not a regular file"},
		{"fifo", fifo, manifest.ErrInvalid, "not a regular file"},
		{"device node", func(p string) error { return syscall.Mknod(p, syscall.S_IFCHR|0o600, int(unixDev(1, 5))) }, manifest.ErrInvalid, "not a regular file"},
		{"sparse file of 64 GiB", sparse(64 << 30), manifest.ErrInvalid, "over"},
	} {
		t.Run("page/"+tc.name, func(t *testing.T) {
			d, _ := spoolOf(t, 3)
			replace(t, filepath.Join(d.Dir, "manifests", "3", "0.json"), tc.make)
			_, err := d.Page(ctx, 0, "")
			if !errors.Is(err, tc.want) || !manifest.IsRefusal(err) || !strings.Contains(err.Error(), "manifests/3/0.json") || !strings.Contains(err.Error(), tc.words) {
				t.Errorf("page: %v; want %v naming the file, %q", err, tc.want, tc.words)
			}
		})
		t.Run("artifact/"+tc.name, func(t *testing.T) {
			d, e := spoolOf(t, 3)
			replace(t, filepath.Join(d.Dir, "artifacts", e.SHA256), tc.make)
			want := tc.want
			if tc.words == "over" {
				want = manifest.ErrSize
			}
			if _, err := d.Artifact(ctx, e.SHA256); !errors.Is(err, want) || !strings.Contains(err.Error(), tc.words) {
				t.Errorf("artifact: %v; want %v, %q", err, want, tc.words)
			}
		})
		t.Run("snapshot/"+tc.name, func(t *testing.T) {
			d, _ := spoolOf(t, 3)
			replace(t, filepath.Join(d.Dir, "snapshot.tar.gz"), tc.make)
			rc, err := d.Snapshot(ctx)
			if err == nil {
				rc.Close()
			}
			if !manifest.IsRefusal(err) || !strings.Contains(err.Error(), "snapshot.tar.gz") {
				t.Errorf("snapshot: %v; want a refusal naming the file", err)
			}
		})
	}
	// manifests/ itself a FIFO: a failed poll at once, not a hang.
	d, _ := spoolOf(t, 3)
	if err := os.RemoveAll(filepath.Join(d.Dir, "manifests")); err != nil {
		t.Fatal(err)
	}
	if err := fifo(filepath.Join(d.Dir, "manifests")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Page(ctx, 0, ""); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("manifests/ a FIFO: %v", err)
	}
	// A page just over its bound, of real bytes.
	d, _ = spoolOf(t, 3)
	big := append([]byte(`{"edge_id":"`), bytes.Repeat([]byte("a"), manifest.MaxPageBytes)...)
	if err := os.WriteFile(filepath.Join(d.Dir, "manifests", "3", "0.json"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Page(ctx, 0, ""); !errors.Is(err, manifest.ErrInvalid) {
		t.Errorf("page over the bound: %v", err)
	}
	// A good spool still reads, and a missing artifact is a failure to
	// retry (the transfer is not finished), not a refusal.
	d, e := spoolOf(t, 3)
	if p, err := d.Page(ctx, 0, ""); err != nil || len(p.Entries) != 1 {
		t.Fatalf("good page: %+v, %v", p, err)
	}
	if data, err := d.Artifact(ctx, e.SHA256); err != nil || string(data) != `{"domain":"a.example.com"}` {
		t.Fatalf("good artifact: %v", err)
	}
	os.Remove(filepath.Join(d.Dir, "artifacts", e.SHA256))
	if _, err := d.Artifact(ctx, e.SHA256); err == nil || manifest.IsRefusal(err) {
		t.Errorf("missing artifact: %v; want a failure that is not a refusal", err)
	}
	// A poll's deadline ends reads.
	done, stop := context.WithCancel(ctx)
	stop()
	if _, err := d.Page(done, 0, ""); !errors.Is(err, context.Canceled) {
		t.Errorf("page with its poll's context ended: %v", err)
	}
}

func unixDev(major, minor uint32) uint64 {
	return uint64(major)<<8 | uint64(minor)
}

// FuzzSpoolPage: whatever bytes a spool page holds, reading it neither
// panics nor returns a page that does not validate as Collect would have
// it validated.
func FuzzSpoolPage(f *testing.F) {
	d, _ := spoolOf(f, 3)
	good, _ := os.ReadFile(filepath.Join(d.Dir, "manifests", "3", "0.json"))
	f.Add(good)
	f.Add([]byte(`{"edge_id":"edge","sequence":3,"entries":[],"x":1}`))
	f.Add([]byte("{\"edge_id\":\"\x1b[2J\",\"sequence\":3}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "manifests", "3"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "manifests", "3", "0.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := DirSource{Dir: dir}.Page(context.Background(), 0, "")
		if err != nil {
			if !manifest.IsRefusal(err) {
				t.Fatalf("a page's content is refused, never a failure to retry: %v", err)
			}
			if r := manifest.Reason(err); len(r) > manifest.MaxReasonBytes {
				t.Fatalf("reason of %d bytes", len(r))
			}
			return
		}
		if len(p.Entries) > manifest.MaxEntries && p.Validate() == nil {
			t.Fatal("a page over its bound validated")
		}
	})
}

// A bogus manifest directory numbered above every good one is refused
// once: recorded refused in the spool's acks (the agent cannot ack a page it
// could not parse by its sequence), it is skipped from then on (a restarted
// agent skips it too), and the good manifest below it is the newest again.
// A directory whose page claims another sequence is refused the same way,
// so that the agent's own refusal ack names the directory. Before, it was the newest at every poll and blocked
// every later manifest until an operator deleted it.
func TestSpoolSkipsARefusedSequence(t *testing.T) {
	d, _ := spoolOf(t, 5)
	bogus := filepath.Join(d.Dir, "manifests", "900")
	if err := os.MkdirAll(bogus, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bogus, "0.json"), []byte(`{"not":"a page"`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.Page(ctx, 0, ""); !manifest.IsRefusal(err) {
		t.Fatalf("the bogus sequence 900: %v, want a refusal", err)
	}
	p, err := d.Page(ctx, 0, "")
	if err != nil {
		t.Fatalf("after the refusal of 900: %v", err)
	}
	if p.Header.Sequence != 5 {
		t.Errorf("after the refusal of 900 the spool offers sequence %d, want 5", p.Header.Sequence)
	}
	// A page in directory 901 claiming sequence 5: refused, then skipped.
	if err := os.MkdirAll(filepath.Join(d.Dir, "manifests", "901"), 0o755); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(d.Dir, "manifests", "5", "0.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Dir, "manifests", "901", "0.json"), good, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Page(ctx, 0, ""); err == nil || !strings.Contains(err.Error(), "holds a page of sequence 5") {
		t.Fatalf("a page of 5 in directory 901: %v, want a refusal", err)
	}
	if p, err := d.Page(ctx, 0, ""); err != nil || p.Header.Sequence != 5 {
		t.Fatalf("after the refusal of 901: %v", err)
	}
	// An ack that is not a refusal (applied, partial) hides nothing.
	if err := d.Ack(ctx, manifest.Ack{Sequence: 5, Status: manifest.AckApplied, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if p, err := d.Page(ctx, 0, ""); err != nil || p.Header.Sequence != 5 {
		t.Errorf("an applied ack hid its sequence: %v", err)
	}
	if _, err := d.Page(ctx, 5, ""); !errors.Is(err, manifest.ErrNoChange) {
		t.Errorf("after 5, with 900 refused: %v, want no change", err)
	}
}
