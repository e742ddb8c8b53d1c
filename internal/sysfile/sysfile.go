// Package sysfile reads and writes small files with plain system calls:
// cgroup and proc control files, and the agent's own state on its start
// path. An os.File costs five more system calls on every open than the
// open, read or write, and close they need: it makes the descriptor
// non-blocking, offers it to the runtime's poller, and makes it blocking
// again when the poller refuses it (a regular file) — or, for a cgroup
// control file, which the poller accepts, removes it from the poller when
// it is closed. A cold start of eight cells opens a few hundred such files
// (docs/performance.md, round 12). Its Open, Read, WriteAll and
// IgnoringEINTR are what safefile, atomicfile and the supervisor's log
// files use for the same. Any package may import it.
package sysfile

import (
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// ReadFile reads path whole, as os.ReadFile does, refusing a file of more
// than max bytes (an error that names the bound) without reading the
// rest. Files whose size the kernel does not report (proc and cgroup
// files) are read until end of file all the same. It never waits on a
// FIFO: one with no writer reads as empty, one whose writer is silent
// fails (EAGAIN).
func ReadFile(path string, max int) ([]byte, error) {
	fd, err := Open(path, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return read(fd, path, max)
}

// read reads fd until end of file, at most max bytes: first into 1 KiB,
// enough for a control file or a release.json, then into what fstat says
// is left.
func read(fd int, path string, max int) ([]byte, error) {
	buf := make([]byte, 0, min(1024, max+1))
	for {
		if len(buf) > max {
			return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("over %d bytes", max)}
		}
		if len(buf) == cap(buf) {
			want := 2 * len(buf)
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && st.Size >= int64(want) {
				want = int(min(st.Size, int64(max))) + 1 // +1: its end, or that it grew
			}
			buf = slices.Grow(buf, min(want, max+1)-len(buf))
		}
		// Never more than max+1 bytes in all, whatever the capacity.
		n, err := Read(fd, buf[len(buf):min(cap(buf), max+1)])
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// WriteFile writes data to path as os.WriteFile does (created with perm
// if missing, truncated if not), in one write: a write the kernel takes
// only in part fails. A FIFO with no reader fails (ENXIO) rather than
// being waited on.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return writeAt(path, unix.O_CREAT|unix.O_TRUNC, uint32(perm.Perm()), data)
}

// WriteExisting writes data to the existing file path in one write, as a
// control file is written: without O_CREAT or O_TRUNC, so that a missing
// file fails with an error that is fs.ErrNotExist.
func WriteExisting(path string, data []byte) error {
	return writeAt(path, 0, 0, data)
}

func writeAt(path string, flags int, perm uint32, data []byte) error {
	fd, err := Open(path, unix.O_WRONLY|unix.O_NONBLOCK|flags, perm)
	if err != nil {
		return err
	}
	n, err := write(fd, data)
	cerr := unix.Close(fd)
	switch {
	case err != nil:
		return &os.PathError{Op: "write", Path: path, Err: err}
	case n < len(data):
		return &os.PathError{Op: "write", Path: path, Err: fmt.Errorf("short write: %d of %d bytes", n, len(data))}
	case cerr != nil:
		return &os.PathError{Op: "close", Path: path, Err: cerr}
	}
	return nil
}

// write is one write(2), retried on EINTR: a control file takes a value in
// one write, and a second one with the rest would be another value.
func write(fd int, data []byte) (int, error) {
	var n int
	err := IgnoringEINTR(func() (err error) {
		n, err = unix.Write(fd, data)
		return err
	})
	return max(n, 0), err
}

// WriteAll writes data to fd, however many write(2) calls that takes (a
// regular file's content, not a control file's value).
func WriteAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := write(fd, data)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		data = data[n:]
	}
	return nil
}

// Read is one read(2) into p, retried on EINTR; 0 bytes and no error is
// the end of the file.
func Read(fd int, p []byte) (int, error) {
	var n int
	err := IgnoringEINTR(func() (err error) {
		n, err = unix.Read(fd, p)
		return err
	})
	return max(n, 0), err
}

// Open opens path with flags, perm and O_CLOEXEC, retried on EINTR; its
// error is an *os.PathError, as the os package's. The descriptor is the
// caller's to close (or to hand to os.NewFile, which adds no poller to a
// blocking one).
func Open(path string, flags int, perm uint32) (int, error) {
	fd := -1
	err := IgnoringEINTR(func() (err error) {
		fd, err = unix.Open(path, flags|unix.O_CLOEXEC, perm)
		return err
	})
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// IgnoringEINTR calls f until it fails otherwise than with EINTR (a signal
// that interrupted the system call), as the os package does.
func IgnoringEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}
