package activation

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/manifest"
)

// snapshotArtifact is artifact i of a generated snapshot: about size bytes
// of domain configuration, incompressible, the same every time.
func snapshotArtifact(i, size int, seq int64) (string, []byte) {
	name := fmt.Sprintf("d%05d.example.com", i)
	raw := make([]byte, 0, size*3/4+32)
	for c := 0; len(raw) < size*3/4-200; c++ {
		sum := sha256.Sum256([]byte(fmt.Sprintf("%d/%d", i, c)))
		raw = append(raw, sum[:]...)
	}
	return name, domainJSON(name, domain.PoolSharedDefault, seq, base64.StdEncoding.EncodeToString(raw))
}

// writeBigSnapshot writes a signed snapshot of n artifacts of about size
// bytes to path, one artifact in memory at a time.
// It is signed by the key of the child's rig (newRig seeds it from the
// test's name).
func writeBigSnapshot(tb testing.TB, path string, seq int64, n, size int) {
	seed := sha256.Sum256([]byte("TestSnapshotActivationChild"))
	priv := ed25519.NewKeyFromSeed(seed[:])
	m := manifest.Manifest{EdgeID: edge, Sequence: seq}
	for i := range n {
		name, art := snapshotArtifact(i, size, seq)
		m.Entries = append(m.Entries, manifest.NewEntry(priv, edge, name, domain.PoolSharedDefault, seq, art))
	}
	m = manifest.Sign(priv, m, nil)
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	bw := bufio.NewWriter(f)
	sw, err := manifest.NewSnapshotWriter(bw, m)
	if err != nil {
		tb.Fatal(err)
	}
	for i, e := range m.Entries {
		_, art := snapshotArtifact(i, size, seq)
		if err := sw.Artifact(e.SHA256, art); err != nil {
			tb.Fatal(err)
		}
	}
	if err := sw.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		tb.Fatal(err)
	}
}

// vmHWM is this process's peak resident set so far, in MiB.
func vmHWM(tb testing.TB) float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	tb.Fatal("no VmHWM")
	return 0
}

const childEnv = "CELLVISOR_SNAPSHOT_CHILD"

// BenchmarkSnapshotActivationRSS activates a correctly signed recovery
// snapshot of about 90 MiB (expanded) in a child process and reports the
// child's peak resident set (VmHWM) before and after ApplySnapshot: what
// the agent, limited to 128 MiB, needs to recover a new edge. Two shapes:
// few large artifacts, and many small ones; each without a Go memory limit,
// and with the soft limit the agent sets itself (3/4 of its 128 MiB).
func BenchmarkSnapshotActivationRSS(b *testing.B) {
	if path := os.Getenv(childEnv); path != "" {
		b.Skip("child")
	}
	for _, shape := range []struct {
		n, size int
		limit   string
	}{{90, 1000 << 10, "off"}, {90, 1000 << 10, "96MiB"}, {17000, 4600, "off"}, {17000, 4600, "96MiB"}} {
		b.Run(fmt.Sprintf("artifacts=%dx%dKiB/gomemlimit=%s", shape.n, shape.size>>10, shape.limit), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "snapshot.tar.gz")
			writeBigSnapshot(b, path, 7, shape.n, shape.size)
			st, _ := os.Stat(path)
			var before, after float64
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSnapshotActivationChild$", "-test.v")
				cmd.Env = append(os.Environ(), childEnv+"="+path, "CELLVISOR_SNAPSHOT_N="+strconv.Itoa(shape.n), "GOMEMLIMIT="+shape.limit)
				out, err := cmd.CombinedOutput()
				cancel()
				if err != nil {
					b.Fatalf("child: %v\n%s", err, out)
				}
				if _, err := fmt.Sscanf(string(out[strings.Index(string(out), "hwm ")+4:]), "%f %f", &before, &after); err != nil {
					b.Fatalf("child said: %s", out)
				}
			}
			b.ReportMetric(float64(st.Size())/(1<<20), "MiB-snapshot")
			b.ReportMetric(before, "MiB-hwm-before")
			b.ReportMetric(after, "MiB-hwm-peak")
		})
	}
}

// TestSnapshotActivationChild is the child of BenchmarkSnapshotActivationRSS.
func TestSnapshotActivationChild(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		t.Skip("run by BenchmarkSnapshotActivationRSS")
	}
	r := newRig(t)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := vmHWM(t)
	if err := r.a.ApplySnapshot(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	after := vmHWM(t)
	n, _ := strconv.Atoi(os.Getenv("CELLVISOR_SNAPSHOT_N"))
	if a := r.lastAck(); r.a.Active() != 7 || a.Status != manifest.AckApplied || strings.Count(r.poolJSON("cell-01"), `"respond"`) != n {
		t.Fatalf("not applied: active %d, ack %+v", r.a.Active(), a)
	}
	fmt.Printf("hwm %.1f %.1f\n", before, after)
}
