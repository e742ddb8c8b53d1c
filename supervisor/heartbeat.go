package supervisor

import "time"

// Heartbeat returns when the supervisor's monitor loop last turned (zero
// before Run) and the longest gap a live one leaves: its interval plus the
// bounded per-cell status reads of one turn, plus an interval of slack. The
// turn takes every slot's lock, so a slot stuck holding it stops the
// heartbeat too. The systemd watchdog pings only while it is recent.
func (s *Supervisor) Heartbeat() (last time.Time, within time.Duration) {
	if ns := s.beat.Load(); ns != 0 {
		last = time.Unix(0, ns)
	}
	return last, 2*s.o.MonitorInterval + time.Duration(len(s.slots))*cellStatusTimeout
}

// cellStatusTimeout bounds the monitor's status read of one cell.
const cellStatusTimeout = time.Second
