package store

import (
	"os"
	"path/filepath"
	"testing"
)

// The SQLite file holds token hashes, identities and artifacts: it and its
// -wal and -shm files are 0600 whatever the umask, an existing file made
// looser is tightened, and a link in its place is refused.
func TestSQLiteFilesArePrivate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "control.db")
	s := open(t, path)
	newEdge(t, s, "fra-1") // a write, so the WAL exists
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s is %v, want 0600", filepath.Base(f), fi.Mode().Perm())
		}
	}

	loose := filepath.Join(dir, "loose.db")
	if err := os.WriteFile(loose, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	open(t, loose)
	if fi, err := os.Stat(loose); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("an existing 0644 file was left %v (%v), want 0600", fi.Mode().Perm(), err)
	}

	link := filepath.Join(dir, "link.db")
	if err := os.Symlink(loose, link); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(ctx(t), link); err == nil {
		s.Close()
		t.Error("a symlink in place of the database was opened")
	}
}
