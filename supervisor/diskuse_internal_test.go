package supervisor

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// heldDirs counts the files in each directory and the files a process
// holds open there after they were unlinked, each once, and nothing
// outside the directories.
func TestHeldDirs(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, d := range []string{a, filepath.Join(a, "x", "yz"), b} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path string, n int) *os.File {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if _, err := f.Write(make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		return f
	}
	write(filepath.Join(a, "x", "yz", "entry"), 64<<10) // linked, open: counted once
	write(filepath.Join(root, "outside"), 64<<10)       // in no directory measured
	write(filepath.Join(b, "body"), 128<<10)
	if err := os.Remove(filepath.Join(b, "body")); err != nil { // unlinked, still open
		t.Fatal(err)
	}
	h, entries, err := heldDirs([]string{a, b, filepath.Join(root, "missing")}, []int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if h[0].bytes < 64<<10 || h[0].bytes >= 128<<10 || h[0].unlinked != 0 {
		t.Errorf("a: %+v, want 64 KiB (one file, counted once), none unlinked", h[0])
	}
	if h[1].bytes < 128<<10 || h[1].unlinked != h[1].bytes {
		t.Errorf("b: %+v, want 128 KiB, all of it unlinked", h[1])
	}
	if h[2] != (held{}) {
		t.Errorf("a missing directory holds %+v, want nothing", h[2])
	}
	if entries == 0 {
		t.Error("no entries counted")
	}
}

// BenchmarkHeldDirs measures a cache of 1,000 files and this process's
// open files: the cost per entry that spaces the disk watch's looks
// (diskEntryCost).
func BenchmarkHeldDirs(b *testing.B) {
	dir := b.TempDir()
	for i := range 1000 {
		sub := filepath.Join(dir, strconv.Itoa(i%16), strconv.Itoa(i%256))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, strconv.Itoa(i)), []byte("x"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	pids := []int{os.Getpid()}
	var entries int
	for b.Loop() {
		var err error
		if _, entries, err = heldDirs([]string{dir}, pids); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(entries), "ns/entry")
}
