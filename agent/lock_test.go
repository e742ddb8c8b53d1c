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
