package cgroup

import (
	"sync"

	"golang.org/x/sys/unix"
)

// clone3Probe caches whether clone3 can be called: the kernel has it (5.3+)
// and no seccomp filter answers it. systemd's RestrictNamespaces= (any value
// but "no") answers every clone3 with ENOSYS, because a seccomp filter cannot
// read clone3's flags: they are in a struct in memory.
var clone3Probe = sync.OnceValue(func() bool {
	// A size below the first version of struct clone_args makes the kernel
	// refuse with EINVAL before it creates anything; a filter, or a kernel
	// without clone3, answers ENOSYS (or a filter's errno) instead.
	_, _, errno := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	return errno == unix.EINVAL
})

// forceJoin, set by tests, starts v2 cells through the join helper as if
// clone3 were unavailable.
var forceJoin bool

// cloneIntoCgroup reports whether v2 cells can be cloned straight into
// their cgroup (clone3 with CLONE_INTO_CGROUP); where they cannot, they
// start through the join helper, as on v1.
func cloneIntoCgroup() bool { return !forceJoin && clone3Probe() }

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
