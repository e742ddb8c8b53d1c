package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"cellvisor/domain"
	"cellvisor/internal/atomicfile"
	"cellvisor/internal/sysfile"
)

const assignmentsFile = "assignments.json"

// Assignments maps slot names to pools; unassigned slots are absent.
type Assignments map[string]string

// InitialAssignments is cell-01 → shared-default, cell-02 → quarantine-default.
func InitialAssignments(t Topology) Assignments {
	a := Assignments{}
	for _, s := range t.Slots {
		switch s.Index {
		case 1:
			a[s.Name] = domain.PoolSharedDefault
		case 2:
			a[s.Name] = domain.PoolQuarantineDefault
		}
	}
	return a
}

// LoadOrCreateAssignments returns the persisted assignments, creating the
// initial ones on first start.
func LoadOrCreateAssignments(stateDir string, t Topology) (Assignments, error) {
	path := filepath.Join(stateDir, assignmentsFile)
	data, err := sysfile.ReadFile(path, maxStateFile)
	if os.IsNotExist(err) {
		a := InitialAssignments(t)
		return a, SaveAssignments(stateDir, t, a)
	}
	if err != nil {
		return nil, fmt.Errorf("read assignments: %w", err)
	}
	var a Assignments
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("read assignments %s: %w", path, err)
	}
	return a, a.Check(t)
}

// Check refuses assignments to unknown slots or pools of no known class.
func (a Assignments) Check(t Topology) error {
	for slot, pool := range a {
		if _, ok := t.Slot(slot); !ok {
			return fmt.Errorf("assignment of unknown slot %q", slot)
		}
		if _, ok := domain.PoolClass(pool); !ok {
			return fmt.Errorf("assignment of %s to %q: not a shared-, reserved-, dedicated- or quarantine- pool", slot, pool)
		}
	}
	return nil
}

// SaveAssignments persists assignments atomically.
func SaveAssignments(stateDir string, t Topology, a Assignments) error {
	if err := a.Check(t); err != nil {
		return err
	}
	out, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(stateDir, assignmentsFile), append(out, '\n'), 0o644)
}

const limitsFile = "pool-limits.json"

// LoadPoolLimits returns the persisted limits of the pools of the last
// signed assignments, by pool; none persisted (standalone, or a spool
// without assignments) means none.
func LoadPoolLimits(stateDir string) (map[string]PoolLimits, error) {
	data, err := sysfile.ReadFile(filepath.Join(stateDir, limitsFile), maxStateFile)
	if os.IsNotExist(err) {
		return map[string]PoolLimits{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pool limits: %w", err)
	}
	out := map[string]PoolLimits{}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("read pool limits: %w", err)
	}
	return out, nil
}

// SavePlacement persists signed assignments and their pools' limits once
// they are applied, each file atomically: the limits first, so that the
// assignments on disk never name a pool whose limits are older than them.
func SavePlacement(stateDir string, t Topology, a Assignments, limits map[string]PoolLimits) error {
	if err := a.Check(t); err != nil {
		return err
	}
	out, err := json.MarshalIndent(limits, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(stateDir, limitsFile), append(out, '\n'), 0o644); err != nil {
		return fmt.Errorf("save pool limits: %w", err)
	}
	return SaveAssignments(stateDir, t, a)
}
