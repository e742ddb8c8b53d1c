package cgexec

// supported: this platform has the built-in helper (entry_linux_amd64.s).
const supported = true

// entry is the process entry point of a binary linked with LDFlags: the
// helper when argv[0] is JoinName or StandbyName, Go's own entry point
// (_rt0_amd64_linux) otherwise. It is never called from Go.
//
//lint:ignore U1000 the linker's entry point (LDFlags); entryPC takes its address in assembly
func entry()

// entryPC returns entry's address.
func entryPC() uintptr
