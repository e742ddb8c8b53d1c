package sdscope_test

import "syscall"

// syscallKill0 reports whether pid exists (nil) or not.
func syscallKill0(pid int) error { return syscall.Kill(pid, 0) }
