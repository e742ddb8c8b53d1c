// Package buildid reads the running binary's Go build ID: a hash of
// everything the binary was built from (its code and embedded files, its
// dependencies, the Go toolchain), so that two binaries share it only
// when they would behave the same. The agent keys what it derives from
// its own code (a standalone release's render inputs) with it. Only
// runtime imports it.
package buildid

import (
	"bytes"
	"encoding/binary"
	"sync"

	"golang.org/x/sys/unix"
)

// Self is the running binary's Go build ID, read once from its ELF notes
// through /proc/self/exe (the running binary even where an upgrade has
// replaced the file); "" where there is none to read (a build with an
// empty -buildid, another object format).
var Self = sync.OnceValue(func() string {
	fd, err := unix.Open("/proc/self/exe", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	// The go linker puts the note first, within the first page.
	head := make([]byte, 4096)
	n, err := unix.Pread(fd, head, 0)
	if err != nil {
		return ""
	}
	return FromELF(head[:max(n, 0)])
})

// FromELF finds the Go build ID note in the start of a little-endian
// 64-bit ELF file, head, or returns "".
func FromELF(head []byte) string {
	if len(head) < 64 || !bytes.Equal(head[:4], []byte("\x7fELF")) || head[4] != 2 || head[5] != 1 {
		return ""
	}
	le := binary.LittleEndian
	phoff, phentsize, phnum := le.Uint64(head[0x20:]), uint64(le.Uint16(head[0x36:])), uint64(le.Uint16(head[0x38:]))
	for i := range phnum {
		ph := phoff + i*phentsize
		if phentsize < 0x28 || ph+0x28 > uint64(len(head)) {
			return ""
		}
		if le.Uint32(head[ph:]) != 4 { // PT_NOTE
			continue
		}
		off, size := le.Uint64(head[ph+8:]), le.Uint64(head[ph+0x20:])
		if off > uint64(len(head)) || size > uint64(len(head))-off {
			continue
		}
		if id := goNote(head[off : off+size]); id != "" {
			return id
		}
	}
	return ""
}

// goNote is the Go build ID in a PT_NOTE segment's notes: name "Go",
// type 4.
func goNote(notes []byte) string {
	le := binary.LittleEndian
	align := func(n uint64) uint64 { return (n + 3) &^ 3 }
	for len(notes) >= 12 {
		namesz, descsz, typ := uint64(le.Uint32(notes)), uint64(le.Uint32(notes[4:])), le.Uint32(notes[8:])
		rest := notes[12:]
		if align(namesz) > uint64(len(rest)) || align(namesz)+descsz > uint64(len(rest)) {
			return ""
		}
		name, desc := rest[:namesz], rest[align(namesz):align(namesz)+descsz]
		if typ == 4 && string(bytes.TrimRight(name, "\x00")) == "Go" {
			return string(desc)
		}
		next := align(namesz) + align(descsz)
		if next > uint64(len(rest)) {
			return ""
		}
		notes = rest[next:]
	}
	return ""
}
