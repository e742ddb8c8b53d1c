package supervisor

import (
	"context"

	"go.uber.org/zap"
)

// An operator's roll (cellvisor upgrade-runtime): what the agent would do
// with the binary now at the configured path, verified as a roll verifies
// it, and, unless a dry run, the roll started on the runtime routine (which
// the manual policy otherwise keeps from rolling). The answer does not wait
// for the roll: status follows it.

// How a cell is moved onto a new binary.
const (
	HowBinaryUpgrade = "nginx binary upgrade (USR2)"
	HowRestart       = "drain, restart on the held listeners"
)

// UpgradePlan is what a roll onto the configured binary does, or would do.
type UpgradePlan struct {
	Binary  string        `json:"binary"`
	Version string        `json:"version,omitempty"`
	Policy  UpgradePolicy `json:"policy"`
	DryRun  bool          `json:"dry_run"`
	// Verified says the binary said its version and accepted every
	// assigned cell's configuration (-t); Error says why not.
	Verified bool   `json:"verified"`
	Error    string `json:"error,omitempty"`
	// Cells are the cells that run a superseded binary, in the order the
	// roll takes them.
	Cells []PlannedCell `json:"cells"`
	// Started says the roll was started (not a dry run, verified, cells
	// to roll).
	Started bool `json:"started"`
}

// PlannedCell is one cell a roll moves.
type PlannedCell struct {
	Name    string `json:"name"`
	Pool    string `json:"pool"`
	PID     int    `json:"pid"`
	Version string `json:"version,omitempty"` // what its master runs ("" unknown)
	How     string `json:"how"`
}

// UpgradeRuntime says what a roll onto the configured binary does and,
// unless dryRun, starts it, whatever the policy.
func (s *Supervisor) UpgradeRuntime(ctx context.Context, dryRun bool) (UpgradePlan, error) {
	s.learnVersion(ctx)
	plan := UpgradePlan{Binary: s.o.Binary, Policy: s.settings().RuntimeUpgrade, DryRun: dryRun, Cells: []PlannedCell{}}
	cur := s.bin.Load()
	if cur == nil {
		plan.Error = ErrBinary.Error() + ": " + s.o.Binary + " cannot be read"
		return plan, nil
	}
	plan.Version = cur.Version
	for _, c := range s.superseded(cur) {
		pid, _ := c.running()
		c.mu.Lock()
		v := c.bin.Version
		c.mu.Unlock()
		how := HowRestart
		if c.takesUSR2(pid) {
			how = HowBinaryUpgrade
		}
		plan.Cells = append(plan.Cells, PlannedCell{Name: c.spec.Name, Pool: c.poolName(), PID: pid, Version: v, How: how})
	}
	err := s.verify(ctx)
	if err == nil && cur.Version == "" {
		err = ErrBinary
	}
	if err != nil {
		if ctx.Err() != nil {
			return plan, ctx.Err()
		}
		plan.Error = err.Error()
		return plan, nil
	}
	plan.Verified = true
	if !dryRun && len(plan.Cells) > 0 {
		s.forceRoll.Store(true)
		s.kickRuntime()
		plan.Started = true
		s.log.Info("runtime upgrade asked for by the operator", zap.Int("cells", len(plan.Cells)))
	}
	return plan, nil
}
