package supervisor

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"cellvisor/cgroup"
)

// Settings are what may change while cells run (SIGHUP): every read of them
// takes the current value; a running cell's cgroup takes new limits at once.
type Settings struct {
	// Limits are every cell's limits.
	Limits cgroup.Limits
	// Policy is the crash-restart backoff, for restarts from now on.
	Policy Policy
	// Liveness applies from a cell's next readiness.
	Liveness LivenessPolicy
	// RestartLimit, RestartWindow and DrainTimeout: operator restarts.
	RestartLimit  int
	RestartWindow time.Duration
	DrainTimeout  time.Duration
	// RuntimeUpgrade says whether cells are rolled onto a new binary by
	// themselves (UpgradeAuto, the default for "") or by an operator
	// (UpgradeManual: UpgradeRuntime).
	RuntimeUpgrade UpgradePolicy
	// RuntimeUpgradePace is, under UpgradePaced, how long a rolled cell
	// must stay ready on the new binary before the next is rolled; zero
	// means DefaultUpgradePace.
	RuntimeUpgradePace time.Duration
}

// settings are the current settings.
func (s *Supervisor) settings() *Settings { return s.live.Load() }

// DrainTimeout is the current drain timeout of operator restarts: what a
// caller bounding a restart (a control task) adds up, reloaded or not.
func (s *Supervisor) DrainTimeout() time.Duration { return s.settings().DrainTimeout }

// withDefaults fills zero values as New does.
func (st Settings) withDefaults() Settings {
	if st.Policy == (Policy{}) {
		st.Policy = Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Minute, HealthyAfter: 30 * time.Second}
	}
	if st.RestartLimit == 0 {
		st.RestartLimit = 3
	}
	if st.RestartWindow == 0 {
		st.RestartWindow = 10 * time.Minute
	}
	if st.DrainTimeout == 0 {
		st.DrainTimeout = 30 * time.Second
	}
	st.Liveness = st.Liveness.withDefaults()
	if st.RuntimeUpgrade == "" {
		st.RuntimeUpgrade = UpgradeAuto
	}
	if st.RuntimeUpgradePace == 0 {
		st.RuntimeUpgradePace = DefaultUpgradePace
	}
	return st
}

// Update applies new settings while cells run: later reads take them, and
// every existing cell cgroup is given the new limits (no cell restarts).
func (s *Supervisor) Update(ctx context.Context, st Settings) error {
	st = st.withDefaults()
	prev := s.live.Swap(&st)
	if prev.RuntimeUpgrade != st.RuntimeUpgrade {
		s.kickRuntime() // a roll waiting for the operator may start now
	}
	if prev.Limits == st.Limits {
		s.log.Info("settings updated; cell limits unchanged")
		return nil
	}
	for _, c := range s.slots {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.mu.Lock()
		g := c.group
		c.mu.Unlock()
		if g == nil || g.Path() == "" {
			continue
		}
		if _, err := s.o.Cgroups.Ensure(c.spec.Name, st.Limits); err != nil {
			return fmt.Errorf("update limits of %s: %w", c.spec.Name, err)
		}
		c.log.Info("cell limits updated", zap.Int64("memory_bytes", st.Limits.MemoryBytes),
			zap.Int64("cpu_quota_us", st.Limits.CPUQuotaUS), zap.Int64("pids", st.Limits.PIDs))
	}
	return nil
}
