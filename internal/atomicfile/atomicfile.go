// Package atomicfile writes files and directory entries durably: a file is
// written beside its final name, fsynced, renamed into place and its
// directory fsynced, so that a crash leaves the old file or the new one,
// never a mix. The agent's state, identity and release writers use it.
// Replace does the same without the fsyncs, for files that describe only
// this boot (the run directory's).
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
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
// the file first when sync is set.
func write(path string, data []byte, perm os.FileMode, sync bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// rename(2) itself: os.Rename first stats path to refuse a
		// directory there, which rename refuses anyway (EISDIR).
		if err = syscall.Rename(tmp, path); err != nil {
			err = &os.LinkError{Op: "rename", Old: tmp, New: path, Err: err}
		}
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// SyncDir fsyncs a directory so renames and creations in it are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
