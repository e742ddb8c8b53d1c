package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockFile is the demo directory's lock: one demo per directory. It is
// taken before anything in the directory is removed, and released by the
// kernel when the demo exits, however it exits.
const lockFile = "demo.lock"

// ErrBusy is returned when another demo holds the directory.
var ErrBusy = errors.New("another demo is running in this directory")

// dirLock is a held lock on a demo directory.
type dirLock struct{ f *os.File }

// lockDir takes root's lock without waiting, and writes this process's pid
// into it for the message a second demo prints.
func lockDir(root string) (*dirLock, error) {
	path := filepath.Join(root, lockFile)
	// O_NOFOLLOW: a symlink planted in place of the lock is refused, not
	// followed to truncate another file.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the demo lock: %w", err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("demo lock %s: not a regular file", path)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
					holder = fmt.Sprintf("pid %d", pid)
				}
			}
			return nil, fmt.Errorf("%w (%s holds %s): stop it first (Ctrl-C in its terminal), or give this one another --dir; nothing was changed",
				ErrBusy, holder, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dirLock{f: f}, nil
}

// release unlocks; the file stays, empty of meaning until the next lock.
func (l *dirLock) release() {
	_ = l.f.Truncate(0)
	l.f.Close()
}
