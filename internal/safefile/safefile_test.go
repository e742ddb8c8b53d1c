package safefile

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestOpenRefusesAnythingButRegularFilesWithinTheBound(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", []byte("hello"))
	link := filepath.Join(dir, "link")
	os.Symlink(good, link)
	zero := filepath.Join(dir, "zero")
	os.Symlink("/dev/zero", zero)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sparse := filepath.Join(dir, "sparse")
	f, _ := os.Create(sparse)
	f.Truncate(1 << 40) // 1 TiB, no blocks
	f.Close()
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o700)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if data, err := ReadFile(ctx, good, 5); err != nil || string(data) != "hello" {
		t.Fatalf("regular file: %q, %v", data, err)
	}
	for _, tc := range []struct {
		name, path string
		max        int64
		want       error
	}{
		{"symlink to a regular file", link, 100, ErrNotRegular},
		{"symlink to /dev/zero", zero, 100, ErrNotRegular},
		{"fifo", fifo, 100, ErrNotRegular},
		{"directory", sub, 100, ErrNotRegular},
		{"device", "/dev/zero", 100, ErrNotRegular},
		{"sparse file over the bound", sparse, 1 << 20, ErrTooLarge},
		{"one byte over the bound", good, 4, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := ReadFile(ctx, tc.path, tc.max)
			if !errors.Is(err, tc.want) || !IsRefusal(err) || data != nil {
				t.Errorf("err %v, %d bytes; want %v", err, len(data), tc.want)
			}
		})
	}
	if _, err := ReadFile(ctx, filepath.Join(dir, "missing"), 10); !os.IsNotExist(err) || IsRefusal(err) {
		t.Errorf("missing file: %v, want not-exist", err)
	}
	done, stop := context.WithCancel(ctx)
	stop()
	if _, err := ReadFile(done, good, 5); !errors.Is(err, context.Canceled) {
		t.Errorf("ended context: %v", err)
	}
}

func TestCopyStreamsARegularFileWithinItsBound(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 200_000) // more than one chunk and one buffer
	for i := range data {
		data[i] = byte(i % 251)
	}
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	n, err := Copy(&got, p, int64(len(data)), make([]byte, 32<<10))
	if err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("copied %d bytes (%d in the writer), %v; want the file's %d", n, got.Len(), err, len(data))
	}
	if _, err := Copy(io.Discard, p, int64(len(data))-1, make([]byte, 32<<10)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the bound: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Copy(io.Discard, fifo, 10, nil); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("fifo: %v", err)
	}
}

// A Dir reads its files by relative names with the same rules: a final
// link, a FIFO or a file over the bound is refused, and errors name the
// whole path.
func TestDirReadsRelativeNamesWithTheSameRules(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "lua"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "lua", "m.lua"), []byte("return 1"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join(root, "lua", "m.lua"), filepath.Join(root, "link"))
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	if b, err := d.ReadFile(ctx, "lua/m.lua", 8); err != nil || string(b) != "return 1" {
		t.Fatalf("lua/m.lua: %q, %v", b, err)
	}
	var got bytes.Buffer
	if n, err := d.Copy(&got, "lua/m.lua", 8, make([]byte, 3)); err != nil || n != 8 || got.String() != "return 1" {
		t.Fatalf("copy: %d %q %v", n, got.String(), err)
	}
	for name, want := range map[string]error{"link": ErrNotRegular, "fifo": ErrNotRegular, "lua": ErrNotRegular} {
		if _, err := d.ReadFile(ctx, name, 100); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	if _, err := d.ReadFile(ctx, "lua/m.lua", 7); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), filepath.Join(root, "lua", "m.lua")) {
		t.Errorf("over the bound: %v, want ErrTooLarge naming the whole path", err)
	}
	if _, err := d.ReadFile(ctx, "missing", 10); !os.IsNotExist(err) {
		t.Errorf("missing: %v", err)
	}
	if _, err := OpenDir(filepath.Join(root, "lua", "m.lua")); err == nil {
		t.Error("a file opened as a directory")
	}
}
