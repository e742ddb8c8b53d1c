package cgroup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrLocked is returned by Lock when another process holds the subtree.
var ErrLocked = errors.New("cgroup subtree in use by another agent")

// lockDir takes an exclusive, non-blocking flock on directory dir, held
// until the returned file is closed or the process exits (a crash frees it).
// cgroupfs directories take flocks like any other, so the lock is the
// subtree's own marker: two agents configured with different state or run
// directories but the same subtree still meet on it.
func lockDir(dir string) (io.Closer, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked%s; one agent per cgroup subtree (set cgroup.subtree to another name for a second agent)", ErrLocked, dir, holders(dir))
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// holders names the processes in dir's agent leaf, to say who holds it.
func holders(dir string) string {
	b, err := readFile(join(dir, AgentLeaf, "cgroup.procs"))
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return ""
	}
	pids := strings.Fields(string(b))
	if _, err := strconv.Atoi(pids[0]); err != nil {
		return ""
	}
	return " (agent pid " + strings.Join(pids, ", ") + ")"
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }
