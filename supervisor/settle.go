package supervisor

import (
	"cellvisor/internal/celluser"
)

// A graceful reload (SIGHUP) starts new workers with the new release and
// tells the old ones to quit: each old worker closes its listening sockets
// when it takes up the signal, then finishes its connections. Until it has,
// it may still accept a new connection and answer it from the old release
// (a domain just added answers 404 there). So a cell has loaded a release
// only once its new workers report it AND no worker of before the reload
// still listens: Loaded waits for both, so that an "applied" ack, and the
// routing a control plane switches on it, mean what they say.

// settled tells whether the workers the cell had before its last reload
// have all stopped listening (or there was no reload).
func (c *slot) settled() bool {
	c.mu.Lock()
	old := c.preReload
	c.mu.Unlock()
	if len(old) == 0 {
		return true
	}
	inodes := listeningInodes([]int{c.spec.HTTPPort, c.spec.HTTPSPort})
	var listening bool
	// The workers' /proc/PID/fd is readable by their user (or root) alone.
	_ = celluser.Do(c.user(), func() error { listening = stillListening(old, inodes); return nil })
	if listening {
		return false
	}
	c.mu.Lock()
	c.preReload = nil
	c.mu.Unlock()
	return true
}
