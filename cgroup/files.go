package cgroup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"cellvisor/internal/backoff"
	"cellvisor/internal/sysfile"
)

// readUint reads a single-number cgroup file; "max" reads as 0.
func readUint(path string) (uint64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// readKV reads a "key value" per line cgroup file (memory.events, cpu.stat).
func readKV(path string) (map[string]uint64, error) {
	b, err := readFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			out[f[0]] = v
		}
	}
	return out, sc.Err()
}

// readProcs reads a cgroup.procs file.
func readProcs(path string) ([]int, error) {
	b, err := readFile(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// maxControlFile bounds what is read of a cgroup or proc file: a
// cgroup.procs of a hundred thousand pids.
const maxControlFile = 1 << 20

// readFile reads a cgroup or proc file (sysfile: a few hundred of them are
// read and written on a cold start, on the start's path).
func readFile(path string) ([]byte, error) { return sysfile.ReadFile(path, maxControlFile) }

// writeFile writes a cgroup control file (as os.WriteFile did, so that the
// unit tests' stand-in hierarchies take it too).
func writeFile(path, value string) error { return sysfile.WriteFile(path, []byte(value), 0o644) }

// waitEmpty polls list until it reports no processes, with a short backoff,
// bounded by ctx. A kill takes effect within microseconds to milliseconds, so
// the first polls are fast.
func waitEmpty(ctx context.Context, list func() ([]int, error)) error {
	b := pollBackoff()
	for {
		pids, err := list()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if err := b.Wait(ctx); err != nil {
			return fmt.Errorf("%w: %v after %v", ErrNotEmpty, pids, err)
		}
	}
}

// pollBackoff paces the waits on the kernel: from 200µs up to 20ms.
func pollBackoff() *backoff.Backoff {
	return &backoff.Backoff{Initial: 200 * time.Microsecond, Max: 20 * time.Millisecond}
}

// SignalFunc runs send as the named group's user, where the kernel
// refuses it to this process: one signal to a member of the group (EPERM
// from this process), or an unenforced group's scan of /proc (under
// ProtectProc=invisible another user's processes are not there). The agent
// runs them as the cell's own user when the cell runs as one
// (celluser.Do): a non-root agent may not signal another user's process
// otherwise.
type SignalFunc func(group string, send func() error) error

// Signaller is implemented by every Manager of this package: SignalAs
// sets how its groups' kills send what this process may not (see
// SignalFunc). Call before any kill; nil sends as this process only.
type Signaller interface {
	SignalAs(f SignalFunc)
}

// signaller holds a manager's SignalFunc.
type signaller struct {
	f atomic.Pointer[SignalFunc]
}

func (s *signaller) SignalAs(f SignalFunc) { s.f.Store(&f) }

// signal sends sig to pid (a negative pid: a process group) of group: as
// this process, else, refused, through the SignalFunc.
func (s *signaller) signal(group string, pid int, sig syscall.Signal) error {
	err := syscall.Kill(pid, sig)
	if errors.Is(err, syscall.EPERM) {
		if f := s.f.Load(); f != nil && *f != nil {
			err = (*f)(group, func() error { return syscall.Kill(pid, sig) })
		}
	}
	return err
}

// killPIDs SIGKILLs each pid of group; a pid that is already gone is not
// an error.
func (s *signaller) killPIDs(group string, pids []int) {
	for _, pid := range pids {
		_ = s.signal(group, pid, syscall.SIGKILL)
	}
}

// reapOrphans collects killed processes that are this process's own
// children (a master killed before its Wait, or orphans if this process is
// PID 1 or a child subreaper in a container). Anything else is reaped by its
// own parent, normally init (systemd), so ECHILD is expected and ignored.
func reapOrphans(pids []int) {
	for _, pid := range pids {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
}

// reapWhenGone is reapOrphans once the killed are gone (a Condemn does not
// wait for that), bounded: what is still there after 10s is left.
func reapWhenGone(pids []int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := pollBackoff()
	for {
		// A child still running reads 0; one reaped reads its pid, and a
		// pid that is not this process's child ECHILD: nothing to wait for.
		pids = slices.DeleteFunc(pids, func(pid int) bool {
			var ws syscall.WaitStatus
			got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			return got != 0 || err != nil
		})
		if len(pids) == 0 || b.Wait(ctx) != nil {
			return
		}
	}
}

// removeDir removes an empty cgroup directory, retrying briefly on EBUSY,
// which the kernel returns while the last exited task is still being released.
func removeDir(ctx context.Context, dir string) error {
	b := pollBackoff()
	for {
		err := syscall.Rmdir(dir)
		if err == nil || os.IsNotExist(err) {
			return nil
		}
		if err != syscall.EBUSY && err != syscall.EAGAIN {
			return fmt.Errorf("remove %s: %w", dir, err)
		}
		if cerr := b.Wait(ctx); cerr != nil {
			return fmt.Errorf("remove %s: %w (%v)", dir, err, cerr)
		}
	}
}

// listCells lists the cell-NN directories in dir.
func listCells(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && IsCellName(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func join(parts ...string) string { return filepath.Join(parts...) }

// writeBurst sets a CPU burst file, where the kernel has one (opened
// without O_CREAT: a missing file is ENOENT, with no stat before).
func writeBurst(path string, us uint64) error {
	err := sysfile.WriteExisting(path, []byte(strconv.FormatUint(us, 10)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

var (
	_ Signaller = (*v1)(nil)
	_ Signaller = (*v2)(nil)
	_ Signaller = (*none)(nil)
)
