//go:build !(linux && amd64)

package cgexec

// supported: this platform has no built-in helper; Join and Standby use the
// shell.
const supported = false

func entryPC() uintptr { return 0 }
