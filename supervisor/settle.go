package supervisor

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"cellvisor/internal/celluser"
	"cellvisor/internal/procstat"
)

// A graceful reload (SIGHUP) starts new workers with the new release and
// tells the old ones to quit: each old worker closes its listening sockets
// when it takes up the signal, then finishes its connections. Until it has,
// it may still accept a new connection and answer it from the old release
// (a domain just added answers 404 there). So a cell has loaded a release
// only once its new workers report it AND no worker of before the reload
// still listens: Loaded waits for both, so that an "applied" ack, and the
// routing a control plane switches on it, mean what they say.

// procID is one process, told apart from a later one with its pid.
type procID struct {
	pid   int
	start uint64 // start time in clock ticks since boot: a recycled pid differs
}

// procRoot is where /proc is.
const procRoot = "/proc"

// children lists the child processes of pid with their start times.
func children(pid int) ([]procID, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/task/%d/children", procRoot, pid, pid))
	if err != nil {
		return nil, err
	}
	var out []procID
	for _, f := range strings.Fields(string(b)) {
		c, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if st, ok := startTime(c); ok {
			out = append(out, procID{c, st})
		}
	}
	return out, nil
}

// killed reports, from a process's stat fields (procstat.Fields), that it can
// no longer run code of its own though it is not a zombie yet: exiting
// (PF_EXITING in the flags, field 9: a killed process that has taken its
// SIGKILL), or with a SIGKILL pending (the signal field, 31, where a kill
// sets it in each of the process's threads).
func killed(f []string) bool {
	if procstat.Exiting(f) {
		return true
	}
	if len(f) < 29 {
		return false
	}
	const sigkill = 1 << (9 - 1)
	pending, err := strconv.ParseUint(f[28], 10, 64)
	return err == nil && pending&sigkill != 0
}

// startTime is a process's start time in clock ticks since boot.
func startTime(pid int) (uint64, bool) {
	f, err := procstat.Fields(pid)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return v, err == nil
}

// listeningInodes returns the socket inodes listening on any of ports
// (TCP, IPv4 and IPv6).
func listeningInodes(ports []int) map[string]bool {
	want := map[string]bool{}
	for _, p := range ports {
		want[fmt.Sprintf("%04X", p)] = true
	}
	out := map[string]bool{}
	for _, f := range []string{"net/tcp", "net/tcp6"} {
		file, err := os.Open(filepath.Join(procRoot, f))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" {
				continue
			}
			if _, port, ok := strings.Cut(fields[1], ":"); ok && want[port] {
				out[fields[9]] = true
			}
		}
		file.Close()
	}
	return out
}

// stillListening tells whether any of procs, if still the same process,
// holds one of the listening sockets.
func stillListening(procs []procID, inodes map[string]bool) bool {
	if len(inodes) == 0 {
		return false
	}
	for _, p := range procs {
		if st, ok := startTime(p.pid); !ok || st != p.start {
			continue // gone, or its pid is another process's now
		}
		dir := fmt.Sprintf("%s/%d/fd", procRoot, p.pid)
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join(dir, fd.Name()))
			if err != nil || !strings.HasPrefix(l, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
				return true
			}
		}
	}
	return false
}

// settled tells whether the workers the cell had before its last reload
// have all stopped listening (or there was no reload).
func (c *slot) settled() bool {
	c.mu.Lock()
	old := c.preReload
	c.mu.Unlock()
	if len(old) == 0 {
		return true
	}
	inodes := listeningInodes([]int{c.spec.HTTPPort, c.spec.HTTPSPort})
	var listening bool
	// The workers' /proc/PID/fd is readable by their user (or root) alone.
	_ = celluser.Do(c.user(), func() error { listening = stillListening(old, inodes); return nil })
	if listening {
		return false
	}
	c.mu.Lock()
	c.preReload = nil
	c.mu.Unlock()
	return true
}
