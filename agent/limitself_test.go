package agent

import (
	"errors"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"cellvisor/cgroup"
)

// selfCG records what the agent asks of its own leaf; its other methods
// are not called here.
type selfCG struct {
	cgroup.Manager
	moveErr error
	moved   bool
	weights []int
	limited *cgroup.Limits
}

func (m *selfCG) MoveSelf() error                 { m.moved = true; return m.moveErr }
func (m *selfCG) WeighSelf(w int) error           { m.weights = append(m.weights, w); return nil }
func (m *selfCG) LimitSelf(l cgroup.Limits) error { m.limited = &l; return nil }

// limitSelf moves the agent into its leaf before it applies the leaf's
// weight and quota; a move that fails is logged as an error and nothing is
// applied to a leaf the agent is not in.
func TestLimitSelfMovesFirst(t *testing.T) {
	l := cgroup.Limits{MemoryBytes: 128 << 20, CPUQuotaUS: 25000, CPUPeriodUS: 100000}

	cg := &selfCG{}
	a := &Agent{cg: cg, selfLimits: &l, log: zap.NewNop()}
	a.limitSelf()
	if !cg.moved || cg.limited == nil || *cg.limited != l || len(cg.weights) != 1 || cg.weights[0] != cgroup.DefaultWeight {
		t.Errorf("moved %v, limits %+v, weights %v: want the move, then the default weight and %+v", cg.moved, cg.limited, cg.weights, l)
	}

	core, logs := observer.New(zap.ErrorLevel)
	cg = &selfCG{moveErr: errors.New("write cgroup.procs: permission denied")}
	a = &Agent{cg: cg, selfLimits: &l, log: zap.New(core)}
	a.limitSelf()
	if cg.limited != nil || len(cg.weights) != 0 {
		t.Errorf("after a failed move: limits %+v, weights %v applied to a leaf the agent is not in", cg.limited, cg.weights)
	}
	if logs.FilterMessageSnippet("move the agent into its own leaf").Len() != 1 {
		t.Errorf("a failed move is not logged as an error: %v", logs.All())
	}
}
