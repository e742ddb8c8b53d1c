// Package atomicfile writes files and directory entries durably: a file is
// written beside its final name, fsynced, renamed into place and its
// directory fsynced, so that a crash leaves the old file or the new one,
// never a mix. The agent's state, identity and release writers use it;
// any package may import it.
// Replace does the same without the fsyncs, for files that describe only
// this boot (the run directory's).
package atomicfile

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"cellvisor/internal/sysfile"
)

// WriteFile writes data to path through a temporary file in the same
// directory, fsyncs it, renames it into place and fsyncs the directory, so a
// crash leaves either the old or the new file, never a mix.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	if err := write(path, data, perm, true); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// Replace writes data to path through a temporary file in the same
// directory and renames it into place, without fsyncs: a reader sees the
// old file or the new one, never a mix, but a crash of the host may leave
// either, or an empty file. It is for files that describe this boot only,
// such as the pid of a running process, which a crash of the host ends
// anyway (in production they are on a tmpfs, where an fsync does nothing).
func Replace(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

// write writes data through a temporary file renamed over path, fsyncing
// the file first when sync is set. With plain system calls (sysfile): an
// os.File adds five to every open and close, and a start writes a record
// for every cell it starts.
func write(path string, data []byte, perm os.FileMode, sync bool) error {
	dir, base := filepath.Split(path)
	var fd int
	var tmp string
	for tries := 0; ; tries++ {
		tmp = dir + "." + base + ".tmp-" + strconv.FormatUint(rand.Uint64(), 36)
		var err error
		if fd, err = sysfile.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600); err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || tries == 10 {
			return err
		}
	}
	err := sysfile.WriteAll(fd, data)
	if err == nil {
		err = sysfile.IgnoringEINTR(func() error { return unix.Fchmod(fd, uint32(perm.Perm())) })
	}
	if err == nil && sync {
		err = sysfile.IgnoringEINTR(func() error { return unix.Fsync(fd) })
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		err = &os.PathError{Op: "write", Path: tmp, Err: err}
	} else if err = unix.Rename(tmp, path); err != nil {
		// rename(2) itself: os.Rename first stats path to refuse a
		// directory there, which rename refuses anyway (EISDIR).
		err = &os.LinkError{Op: "rename", Old: tmp, New: path, Err: err}
	}
	if err != nil {
		unix.Unlink(tmp)
	}
	return err
}

// SyncDir fsyncs a directory so renames and creations in it are durable.
func SyncDir(dir string) error {
	fd, err := sysfile.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := sysfile.IgnoringEINTR(func() error { return unix.Fsync(fd) }); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
