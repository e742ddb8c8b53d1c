package cgroup

import (
	"sync"

	"golang.org/x/sys/unix"
)

// clone3Probe caches whether clone3 can be called: the kernel has it (5.3+)
// and no seccomp filter answers it. systemd's RestrictNamespaces= (any value
// but "no") answers every clone3 with ENOSYS, because a seccomp filter cannot
// read clone3's flags: they are in a struct in memory. Where it can, v2
// cells are cloned straight into their cgroup; where not, they start
// through the join helper, as on v1.
var clone3Probe = sync.OnceValue(func() bool {
	// A size below the first version of struct clone_args makes the kernel
	// refuse with EINVAL before it creates anything; a filter, or a kernel
	// without clone3, answers ENOSYS (or a filter's errno) instead.
	_, _, errno := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	return errno == unix.EINVAL
})

// JoinsCells reports whether m starts cells through the join helper: on v1,
// and on v2 where clone3 is refused.
func JoinsCells(m Manager) bool {
	switch m := m.(type) {
	case *v1:
		return true
	case *v2:
		return m.join
	}
	return false
}
