package sysfile

import (
	"os"
	"path/filepath"
	"testing"
)

// The cost sysfile saves, per call, against the os package: go test -bench
// . ./internal/sysfile. On a cgroup v1 host run as root the control-file
// benchmarks write a real cgroup's file (a group made for the run).

func BenchmarkReadSmallFile(b *testing.B) {
	p := filepath.Join(b.TempDir(), "release.json")
	if err := os.WriteFile(p, make([]byte, 600), 0o600); err != nil {
		b.Fatal(err)
	}
	b.Run("os", func(b *testing.B) {
		for b.Loop() {
			if _, err := os.ReadFile(p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sysfile", func(b *testing.B) {
		for b.Loop() {
			if _, err := ReadFile(p, 4096); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCgroupControlFile(b *testing.B) {
	dir := filepath.Join("/sys/fs/cgroup/pids", "cellvisor-sysfile-bench")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Skipf("no v1 pids hierarchy to write in (%v)", err)
	}
	b.Cleanup(func() { os.Remove(dir) })
	f := filepath.Join(dir, "pids.max")
	b.Run("write/os", func(b *testing.B) {
		for b.Loop() {
			if err := os.WriteFile(f, []byte("128"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("write/sysfile", func(b *testing.B) {
		for b.Loop() {
			if err := WriteExisting(f, []byte("128")); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read/os", func(b *testing.B) {
		for b.Loop() {
			if _, err := os.ReadFile(f); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read/sysfile", func(b *testing.B) {
		for b.Loop() {
			if _, err := ReadFile(f, 4096); err != nil {
				b.Fatal(err)
			}
		}
	})
}
