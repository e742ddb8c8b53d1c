package supervisor

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// What a cell holds on disk under each of its budgeted directories,
// measured as the disk sees it: the blocks of every regular file still
// linked there, and of every file one of the cell's processes holds open
// there, unlinked ones included (nginx unlinks a request body's file as it
// creates it, and a cache file the manager removes lives on while a
// request reads it). Each inode counts once.

// held is one directory's bytes, and how many of them are in files no
// longer linked.
type held struct {
	bytes    int64
	unlinked int64
}

// heldDirs measures dirs at once: one walk of each, and one pass over the
// open files of pids. A directory missing counts as empty. It also returns
// how many entries it looked at, what the measure cost.
func heldDirs(dirs []string, pids []int) ([]held, int, error) {
	out := make([]held, len(dirs))
	entries := 0
	seen := map[[2]uint64]bool{} // device and inode
	for i, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed while walked: the cell may
				}
				return err
			}
			entries++
			if !d.Type().IsRegular() {
				return nil
			}
			var st syscall.Stat_t
			if syscall.Lstat(path, &st) == nil && !seen[[2]uint64{st.Dev, st.Ino}] {
				seen[[2]uint64{st.Dev, st.Ino}] = true
				out[i].bytes += st.Blocks * 512
			}
			return nil
		})
		if err != nil {
			return nil, 0, err
		}
	}
	for _, pid := range pids {
		fdDir := procfs.PIDPath(pid, "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // the process ended
		}
		for _, fd := range fds {
			entries++
			link, err := os.Readlink(fdDir + "/" + fd.Name())
			if err != nil || !strings.HasPrefix(link, "/") {
				continue // a socket, a pipe, or closed meanwhile
			}
			for i, dir := range dirs {
				if !strings.HasPrefix(link, dir+"/") {
					continue
				}
				var st syscall.Stat_t
				if syscall.Stat(fdDir+"/"+fd.Name(), &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || seen[[2]uint64{st.Dev, st.Ino}] {
					break
				}
				seen[[2]uint64{st.Dev, st.Ino}] = true
				out[i].bytes += st.Blocks * 512
				out[i].unlinked += st.Blocks * 512
				break
			}
		}
	}
	return out, entries, nil
}
