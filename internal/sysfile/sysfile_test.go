package sysfile

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReadFileReadsWholeFilesOfEverySize(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{0, 1, 511, 512, 513, 1023, 1024, 4096, 100_000} {
		data := bytes.Repeat([]byte{'x'}, n)
		for i := range data {
			data[i] = byte('a' + i%26)
		}
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadFile(p, 100_000)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%d bytes: read %d bytes, not the file's", n, len(got))
		}
	}
}

func TestReadFileReadsFilesWithoutASize(t *testing.T) {
	// proc files report size 0; this one is over 512 bytes on any host.
	want, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	got, err := ReadFile("/proc/self/maps", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 512 || !strings.HasPrefix(string(got), strings.SplitN(string(want), "\n", 2)[0]) {
		t.Fatalf("read %d bytes of /proc/self/maps, want its whole text", len(got))
	}
}

func TestReadFileRefusesAFileOverItsBound(t *testing.T) {
	p := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(p, make([]byte, 2000), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(p, 1999); err == nil || !strings.Contains(err.Error(), "over 1999 bytes") {
		t.Fatalf("err = %v, want the bound named", err)
	}
	if got, err := ReadFile(p, 2000); err != nil || len(got) != 2000 {
		t.Fatalf("at its bound: %d bytes, %v", len(got), err)
	}
	if _, err := ReadFile("/proc/self/maps", 10); err == nil {
		t.Fatal("a sizeless file over the bound was read")
	}
}

func TestReadFileMissingIsNotExist(t *testing.T) {
	_, err := ReadFile(filepath.Join(t.TempDir(), "none"), 10)
	var pe *fs.PathError
	if !errors.Is(err, fs.ErrNotExist) || !errors.As(err, &pe) || pe.Op != "open" {
		t.Fatalf("err = %v, want an open *PathError that is fs.ErrNotExist", err)
	}
}

func TestWriteExistingWritesAnExistingFileOnly(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "ctl")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteExisting(p, []byte("new!")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "new!" {
		t.Fatalf("file holds %q", b)
	}
	missing := filepath.Join(dir, "missing")
	if err := WriteExisting(missing, []byte("x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want fs.ErrNotExist", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("WriteExisting created a file")
	}
}

func TestWriteFileCreatesAndTruncates(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := WriteFile(p, []byte("a longer text"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if b, _ := os.ReadFile(p); string(b) != "short" || err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("file holds %q, mode %v (%v); want \"short\" and its first mode 0640", b, st.Mode(), err)
	}
}

func TestWriteExistingReportsTheKernelsRefusal(t *testing.T) {
	// A write the file refuses: /proc/self/oom_score_adj takes numbers only.
	err := WriteExisting("/proc/self/oom_score_adj", []byte("not a number"))
	if err == nil {
		t.Fatal("a refused write reported no error")
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Op != "write" {
		t.Fatalf("err = %v, want a write *PathError", err)
	}
}

func TestNeitherWaitsOnAFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// One after the other: side by side, each would be the other's peer.
	done := make(chan error, 1)
	go func() {
		if b, err := ReadFile(fifo, 10); err == nil && len(b) > 0 {
			done <- errors.New("read something from a FIFO with no writer")
			return
		}
		if err := WriteExisting(fifo, []byte("x")); err == nil {
			done <- errors.New("wrote to a FIFO with no reader")
			return
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waited on a FIFO")
	}
}
