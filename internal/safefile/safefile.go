// Package safefile reads files that another party put there (a manifest
// spool, a snapshot's staging area) with their bounds decided before a byte
// is read: regular files only, never through a final symbolic link, never
// blocking on a FIFO or a device, at most a given size, and reads that stop
// when a context ends. controlclient, manifest, outbound, runtime and
// supervisor import it.
package safefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"cellvisor/internal/sysfile"
)

// Errors, by kind of refusal.
var (
	// ErrNotRegular: a symbolic link, FIFO, socket, device or directory.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge: over the bound of what may be read.
	ErrTooLarge = errors.New("file over its bound")
)

// Open opens path for reading, refusing (ErrNotRegular) anything but a
// regular file: the name is looked at with lstat first, so that no link,
// FIFO or device is ever opened, then opened with O_NOFOLLOW|O_NONBLOCK
// (a swap between the two steps cannot make it follow a link or wait on a
// FIFO) and checked again, as opened. A file over max bytes is refused
// (ErrTooLarge) before it is read. It returns the file and its size.
func Open(path string, max int64) (*os.File, int64, error) {
	fd, size, err := open(path, max)
	if err != nil {
		return nil, 0, err
	}
	return os.NewFile(uintptr(fd), path), size, nil
}

// open is Open on a bare descriptor: ReadFile and Copy read it with
// read(2), without the five system calls an os.File adds to its open and
// close (the runtime's poller, offered a file it refuses).
func open(path string, max int64) (int, int64, error) {
	return openAt(unix.AT_FDCWD, path, path, max)
}

// openAt is open of name relative to the directory dirfd (path names it
// in errors).
func openAt(dirfd int, name, path string, max int64) (int, int64, error) {
	var lst, st unix.Stat_t
	if err := sysfile.IgnoringEINTR(func() error { return unix.Fstatat(dirfd, name, &lst, unix.AT_SYMLINK_NOFOLLOW) }); err != nil {
		return -1, 0, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if !regular(lst.Mode) {
		return -1, 0, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, kind(lst.Mode))
	}
	var fd int
	err := sysfile.IgnoringEINTR(func() (err error) {
		fd, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		return err
	})
	if err == unix.ELOOP {
		return -1, 0, fmt.Errorf("%s: %w (a symbolic link)", path, ErrNotRegular)
	}
	if err != nil {
		return -1, 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	switch {
	case !regular(st.Mode) || st.Dev != lst.Dev || st.Ino != lst.Ino:
		unix.Close(fd)
		return -1, 0, fmt.Errorf("%s: %w (%s, replaced while opened)", path, ErrNotRegular, kind(st.Mode))
	case st.Size > max:
		unix.Close(fd)
		return -1, 0, fmt.Errorf("%s: %w: %d bytes, at most %d", path, ErrTooLarge, st.Size, max)
	}
	return fd, st.Size, nil
}

func regular(mode uint32) bool { return mode&unix.S_IFMT == unix.S_IFREG }

func kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFBLK, unix.S_IFCHR:
		return "a device"
	case unix.S_IFDIR:
		return "a directory"
	}
	return "a regular file"
}

// chunk is the most one read(2) takes: a read of a large file notices an
// ended context after at most this much.
const chunk = 64 << 10

// ReadFile reads path whole with Open's rules, at most max bytes (a file
// that grows while it is read is refused too), in chunks that stop once
// ctx ends.
func ReadFile(ctx context.Context, path string, max int64) ([]byte, error) {
	return readFileAt(ctx, unix.AT_FDCWD, path, path, max)
}

func readFileAt(ctx context.Context, dirfd int, name, path string, max int64) ([]byte, error) {
	fd, size, err := openAt(dirfd, name, path, max)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, size+1)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if len(buf) == cap(buf) {
			// Grows only if the file did, and never past max+1 in all.
			buf = slices.Grow(buf, int(min(int64(cap(buf)), max+1-int64(len(buf)))))
		}
		n, err := readChunk(fd, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > max {
			return nil, fmt.Errorf("%s: %w: grew past %d bytes while read", path, ErrTooLarge, max)
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
	}
}

// Copy writes the content of path, opened with Open's rules, to w through
// buf, and returns how many bytes it copied: a file that grows past max
// while it is copied is refused (ErrTooLarge).
func Copy(w io.Writer, path string, max int64, buf []byte) (int64, error) {
	return copyAt(w, unix.AT_FDCWD, path, path, max, buf)
}

func copyAt(w io.Writer, dirfd int, name, path string, max int64, buf []byte) (int64, error) {
	fd, _, err := openAt(dirfd, name, path, max)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if len(buf) == 0 {
		buf = make([]byte, chunk)
	}
	var done int64
	for {
		n, err := readChunk(fd, buf[:min(int64(len(buf)), max+1-done)])
		if err != nil {
			return done, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return done, nil
		}
		if done += int64(n); done > max {
			return done, fmt.Errorf("%s: %w: grew past %d bytes while read", path, ErrTooLarge, max)
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return done, err
		}
	}
}

// readChunk is one read(2) of at most chunk bytes into p.
func readChunk(fd int, p []byte) (int, error) {
	if len(p) > chunk {
		p = p[:chunk]
	}
	return sysfile.Read(fd, p)
}

// Dir is a directory whose files are read with ReadFile's and Copy's rules
// by names relative to it (openat(2), fstatat(2)): the checks of a
// release's files start from its directory instead of walking the whole
// path again for each of them, twice (the lstat, then the open). A name's
// last component is never followed as a link; the directories above it
// are as with a whole path.
type Dir struct {
	fd   int
	path string
}

// OpenDir opens the directory path for Dir's reads.
func OpenDir(path string) (*Dir, error) {
	fd, err := sysfile.Open(path, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	return &Dir{fd: fd, path: path}, nil
}

// Close releases the directory.
func (d *Dir) Close() error { return unix.Close(d.fd) }

// ReadFile is ReadFile of name in d.
func (d *Dir) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	return readFileAt(ctx, d.fd, name, filepath.Join(d.path, name), max)
}

// Copy is Copy of name in d.
func (d *Dir) Copy(w io.Writer, name string, max int64, buf []byte) (int64, error) {
	return copyAt(w, d.fd, name, filepath.Join(d.path, name), max, buf)
}

// Reader returns r whose reads fail with ctx's error once ctx ends, at
// most 64 KiB at a time, so that a long read notices soon.
func Reader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx, r} }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	if len(p) > 64<<10 {
		p = p[:64<<10]
	}
	return c.r.Read(p)
}

// IsRefusal reports an error of Open or ReadFile that refuses the file
// itself (not a regular file, too large), as opposed to failing to read it.
func IsRefusal(err error) bool {
	return errors.Is(err, ErrNotRegular) || errors.Is(err, ErrTooLarge)
}
