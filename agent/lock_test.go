package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStateLock(t *testing.T) {
	dir := t.TempDir()
	// What a previous agent left: a longer pid than this process's.
	if err := os.WriteFile(filepath.Join(dir, lockFile), []byte("4194304\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	first, err := lockState(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockState(dir)
	if !errors.Is(err, ErrStateLocked) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second lock: %v, want ErrStateLocked naming pid %d", err, os.Getpid())
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := lockState(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Close()

	// A link in place of the lock file is not followed.
	linked := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, lockFile), filepath.Join(linked, lockFile)); err != nil {
		t.Fatal(err)
	}
	if l, err := lockState(linked); err == nil {
		l.Close()
		t.Error("a symlinked lock file was followed")
	}
}

// A lock file holding more than a pid record (another writer's) is cut to
// the pid, so that a second agent names the holder.
func TestStateLockOverwritesALongerFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, lockFile), []byte(strings.Repeat("9", 64)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	first, err := lockState(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := lockState(dir); !strings.Contains(fmt.Sprint(err), fmt.Sprintf("(pid %d)", os.Getpid())) {
		t.Errorf("second lock: %v, want it to name pid %d", err, os.Getpid())
	}
	if b, err := os.ReadFile(filepath.Join(dir, lockFile)); err != nil || len(b) != pidRecordLen {
		t.Errorf("lock file %q (%v), want the %d-byte pid record alone", b, err, pidRecordLen)
	}
}
