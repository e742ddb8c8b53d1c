package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// Both writers replace the file whole, with its mode, and leave no
// temporary file beside it.
func TestWritersReplaceWhole(t *testing.T) {
	for name, write := range map[string]func(string, []byte, os.FileMode) error{"WriteFile": WriteFile, "Replace": Replace} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "master.json")
			if err := os.WriteFile(path, []byte("an older and longer content\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := write(path, []byte("new\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != "new\n" {
				t.Errorf("content %q, want %q", got, "new\n")
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("mode %v, want 0600", fi.Mode().Perm())
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 {
				t.Errorf("directory holds %d entries, want the file alone", len(entries))
			}
		})
	}
}

// A directory that cannot be written is an error, and nothing is left.
func TestWritersFailInAMissingDirectory(t *testing.T) {
	for name, write := range map[string]func(string, []byte, os.FileMode) error{"WriteFile": WriteFile, "Replace": Replace} {
		t.Run(name, func(t *testing.T) {
			if err := write(filepath.Join(t.TempDir(), "missing", "f"), []byte("x"), 0o600); err == nil {
				t.Error("write into a missing directory: no error")
			}
		})
	}
}

// A directory in the file's place is an error; it is left as it was, and
// no temporary file is left beside it.
func TestWritersRefuseADirectoryInPlace(t *testing.T) {
	for name, write := range map[string]func(string, []byte, os.FileMode) error{"WriteFile": WriteFile, "Replace": Replace} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "master.json")
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := write(path, []byte("x"), 0o600); err == nil {
				t.Error("a directory in place was replaced, or no error")
			}
			if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
				t.Errorf("the directory is gone: %v", err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("directory holds %d entries, want the directory alone", len(entries))
			}
		})
	}
}
