// Package safefile reads files that another party put there (a manifest
// spool, a snapshot's staging area) with their bounds decided before a byte
// is read: regular files only, never through a final symbolic link, never
// blocking on a FIFO or a device, at most a given size, and reads that stop
// when a context ends. controlclient and manifest import it.
package safefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
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
	lst, err := os.Lstat(path)
	if err != nil {
		return nil, 0, err
	}
	if !lst.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, kind(lst.Mode()))
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, 0, fmt.Errorf("%s: %w (a symbolic link)", path, ErrNotRegular)
	}
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	switch {
	case !st.Mode().IsRegular() || !os.SameFile(lst, st):
		f.Close()
		return nil, 0, fmt.Errorf("%s: %w (%s, replaced while opened)", path, ErrNotRegular, kind(st.Mode()))
	case st.Size() > max:
		f.Close()
		return nil, 0, fmt.Errorf("%s: %w: %d bytes, at most %d", path, ErrTooLarge, st.Size(), max)
	}
	return f, st.Size(), nil
}

func kind(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "a symbolic link"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "a regular file"
}

// ReadFile reads path whole with Open's rules, through a LimitReader of
// max+1 bytes (a file that grows while it is read is refused too), in
// chunks that stop once ctx ends.
func ReadFile(ctx context.Context, path string, max int64) ([]byte, error) {
	f, size, err := Open(path, max)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, 0, size+1)
	for r := Reader(ctx, io.LimitReader(f, max+1)); ; {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // grows only if the file did
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > max {
			return nil, fmt.Errorf("%s: %w: grew past %d bytes while read", path, ErrTooLarge, max)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
	}
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
