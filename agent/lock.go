package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// lockFile is the state directory's lock: held by the running agent, with
// its pid written in it for the error a second agent gets.
const lockFile = "agent.lock"

// ErrStateLocked is returned by New when another agent holds the state
// directory.
var ErrStateLocked = errors.New("state directory in use by another agent")

// lockState takes an exclusive, non-blocking flock on the state directory's
// lock file. The kernel releases it when the process exits, however it
// exits, so a crashed agent never leaves a stale lock behind.
func lockState(stateDir string) (io.Closer, error) {
	path := filepath.Join(stateDir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock state directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := ""
			if b, rerr := io.ReadAll(io.LimitReader(f, 32)); rerr == nil {
				if pid, perr := strconv.Atoi(string(bytes.TrimSpace(b))); perr == nil {
					holder = fmt.Sprintf(" (pid %d)", pid)
				}
			}
			return nil, fmt.Errorf("%w: %s is locked by another agent%s; one agent per state directory", ErrStateLocked, stateDir, holder)
		}
		return nil, fmt.Errorf("lock state directory %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
