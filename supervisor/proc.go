package supervisor

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"cellvisor/internal/procstat"
	"cellvisor/internal/sysfile"
)

// The supervisor's readers of /proc, in one place: what a cell's processes
// are (their start times, children, command line, executable, uid and
// listening sockets), for adoption, reloads and settling.

// procID is one process, told apart from a later one with its pid.
type procID struct {
	pid   int
	start uint64 // start time in clock ticks since boot: a recycled pid differs
}

// procfs is the /proc the supervisor reads: every read of it goes through
// procfs's paths and readers.
var procfs procstat.Reader

// children lists the child processes of pid with their start times.
func children(pid int) ([]procID, error) {
	b, err := os.ReadFile(procfs.PIDPath(pid, "task/"+strconv.Itoa(pid)+"/children"))
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
	f, err := procfs.Fields(pid)
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
		file, err := os.Open(procfs.Path(f))
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
		dir := procfs.PIDPath(p.pid, "fd")
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

// procIdentity is what /proc says about a process.
type procIdentity struct {
	exe        string
	args       []string // the command line, split on NULs and spaces (nginx rewrites its title)
	startTicks uint64
	pgid       int
	uid        int // the real uid
}

// startTicks reads when a live process started, in clock ticks since boot
// (/proc/PID/stat's starttime): with its pid, it names the process across
// pid reuse.
func startTicks(pid int) (uint64, error) {
	f, err := liveStat(pid)
	if err != nil {
		return 0, err
	}
	t, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: starttime: %w", procfs.PIDPath(pid, "stat"), err)
	}
	return t, nil
}

// liveStat reads a process's stat fields (procstat.Fields), refusing a
// process that is dead but for its entry.
func liveStat(pid int) ([]string, error) {
	f, err := procfs.Fields(pid)
	if err == nil && procstat.Dead(f[0]) {
		err = fmt.Errorf("process %d is dead", pid)
	}
	return f, err
}

// identify is identify as the agent, else as the slot's user, if the cell
// runs as one: its /proc/PID/exe is readable by that user (or root) alone.
func (c *slot) identify(pid int) (id procIdentity, err error) {
	err = c.readAsCell(func() error {
		id, err = identify(pid)
		return err
	})
	return id, err
}

// identify reads a process's identity from /proc.
func identify(pid int) (procIdentity, error) {
	var id procIdentity
	dir := procfs.PIDPath(pid, "")
	f, err := liveStat(pid)
	if err != nil {
		return id, err
	}
	if id.pgid, err = strconv.Atoi(f[2]); err != nil {
		return id, fmt.Errorf("%s/stat: pgrp: %w", dir, err)
	}
	if id.startTicks, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return id, fmt.Errorf("%s/stat: starttime: %w", dir, err)
	}
	// Killed a moment ago (its agent was down, or it is being OOM-killed):
	// adopted, it would show ready until it is gone.
	if procstat.Exiting(f) {
		return id, fmt.Errorf("process %d is exiting", pid)
	}
	if id.uid, err = procfs.UID(pid); err != nil {
		return id, err
	}
	switch dying, err := procfs.KillPending(pid); {
	case err != nil:
		return id, err
	case dying:
		return id, fmt.Errorf("process %d has a SIGKILL pending", pid)
	}
	if id.exe, err = os.Readlink(dir + "/exe"); err != nil {
		return id, err
	}
	cmdline, err := sysfile.ReadFile(dir+"/cmdline", 1<<20)
	if err != nil {
		return id, err
	}
	id.args = strings.FieldsFunc(string(cmdline), func(r rune) bool { return r == 0 || r == ' ' })
	return id, nil
}
