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
	writePID(f)
	return f, nil
}

// pidRecordLen is the length the pid is written at in the lock file: padded
// with spaces (a reader trims them), so that it always overwrites a pid an
// earlier agent wrote there.
const pidRecordLen = 20

// writePID writes this process's pid over the lock file's content, best
// effort. It truncates the file only when it holds more than a pid record
// (a file some older writer or someone else filled): freeing a file's data
// blocks is synchronous I/O on a filesystem mounted with online discard
// (ext4's discard option, common on cloud VMs), and truncating at every
// start held the agent's start ~8 ms on such a host.
func writePID(f *os.File) {
	rec := []byte(fmt.Sprintf("%-*d\n", pidRecordLen-1, os.Getpid()))
	if st, err := f.Stat(); err != nil || st.Size() > int64(len(rec)) {
		if err := f.Truncate(0); err != nil {
			return
		}
	}
	_, _ = f.WriteAt(rec, 0)
}
