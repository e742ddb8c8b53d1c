package logbound

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, path string, n int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(bytes.Repeat([]byte("x"), n)); err != nil {
		t.Fatal(err)
	}
}

func TestEnforceRotatesAtAQuarterAndReopens(t *testing.T) {
	dir := t.TempDir()
	reopened := 0
	b, err := New(Options{Dir: dir, Budget: 1000, Reopen: func() error { reopened++; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "access.log"), 249)
	if err := b.Enforce(); err != nil || reopened != 0 {
		t.Fatalf("under the threshold: err %v, reopened %d", err, reopened)
	}
	write(t, filepath.Join(dir, "access.log"), 1)
	if err := b.Enforce(); err != nil {
		t.Fatal(err)
	}
	if reopened != 1 {
		t.Errorf("reopened %d times, want 1", reopened)
	}
	if _, err := os.Stat(filepath.Join(dir, "access.log.1")); err != nil {
		t.Errorf("no rotated generation: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "access.log")); !os.IsNotExist(err) {
		t.Errorf("live file still there after rotation (the writer recreates it): %v", err)
	}
}

func TestEnforceDeletesRotatedGenerationsOverBudget(t *testing.T) {
	dir := t.TempDir()
	b, _ := New(Options{Dir: dir, Budget: 1000})
	write(t, filepath.Join(dir, "a.log.1"), 600)
	write(t, filepath.Join(dir, "b.log.1"), 300)
	write(t, filepath.Join(dir, "a.log"), 200)
	if err := b.Enforce(); err != nil {
		t.Fatal(err)
	}
	size, _ := Size(dir)
	if size > 1000 {
		t.Errorf("directory holds %d bytes, budget 1000", size)
	}
	if _, err := os.Stat(filepath.Join(dir, "a.log")); err != nil {
		t.Error("a live log was deleted")
	}
}
