package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"cellvisor/config"
	"cellvisor/sdscope"
)

// busTimeout bounds every exchange with systemd over the system bus: a bus
// that hangs must not hold up a start or a stop.
const busTimeout = 5 * time.Second

// cellScope is the cells' systemd scope the agent runs with, when it does.
type cellScope struct {
	conn  *sdscope.Conn
	unit  string // the agent's unit, whose jobs tell a stop from a restart
	scope sdscope.Scope
}

// setupScope finds the cells' scope (created by the privileged pre-start
// step for a non-root agent), or creates it, according to cgroup.scope. It
// returns nil where the cells stay in the agent's own cgroup: off, or auto
// outside systemd or without a usable bus (logged, with the reason).
func (a *Agent) setupScope() (*cellScope, error) {
	mode := a.cfg.ScopeMode()
	if mode == config.ScopeOff {
		return nil, nil
	}
	if mode == config.ScopeAuto && !sdscope.UnderSystemd() {
		a.log.Debug("not running under systemd: the cells stay in the agent's cgroup")
		return nil, nil
	}
	s, err := a.findOrCreateScope()
	if err != nil {
		if mode == config.ScopeOn {
			return nil, fmt.Errorf("cells' systemd scope (cgroup.scope: on): %w", err)
		}
		a.log.Warn("no systemd scope for the cells: they stay in the agent's unit and a restart of the unit stops them", zap.Error(err))
		return nil, nil
	}
	a.log.Info("cells in their own systemd scope", zap.String("scope", s.scope.Name), zap.String("cgroup", s.scope.ControlGroup), zap.String("unit", s.unit))
	return s, nil
}

func (a *Agent) findOrCreateScope() (*cellScope, error) {
	ctx, cancel := context.WithTimeout(context.Background(), busTimeout)
	defer cancel()
	conn, err := sdscope.Dial(ctx)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			conn.Close()
		}
	}()
	unit, err := conn.OwnUnit(ctx)
	if err != nil {
		return nil, err
	}
	name := sdscope.ScopeName(unit)
	sc, err := conn.Find(ctx, name)
	if errors.Is(err, sdscope.ErrNotFound) {
		a.log.Info("creating the cells' systemd scope", zap.String("scope", name))
		sc, err = conn.Create(ctx, sdscope.CreateOptions{Name: name, Unit: unit, UID: -1, GID: -1, Root: a.cfg.Cgroup.Root})
	}
	if err != nil {
		return nil, err
	}
	ok = true
	return &cellScope{conn: conn, unit: unit, scope: sc}, nil
}

// keepCells decides, when the agent is told to end, whether its cells keep
// running for the next agent: only with a scope of their own, only when no
// explicit shutdown was asked for, and only when systemd says the unit's job
// is a restart. A bus that cannot answer stops them: leaving cells running
// behind an agent that may never come back (a stop whose job we could not
// read) is worse than restarting them, which is what a restart did before
// cells had a scope.
func (a *Agent) keepCells() bool {
	if a.scope == nil || a.explicitStop.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), busTimeout)
	defer cancel()
	job, err := a.scope.conn.UnitJob(ctx, a.scope.unit)
	if err != nil {
		a.log.Error("cannot tell a stop from a restart: stopping the cells", zap.Error(err))
		return false
	}
	keep := sdscope.KeepsCells(job)
	a.log.Info("told to end", zap.String("job", job), zap.Bool("cells_keep_running", keep))
	return keep
}

// releaseScope ends the cells' scope once they are stopped for good.
func (a *Agent) releaseScope() {
	if a.scope == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), busTimeout)
	defer cancel()
	if err := a.scope.conn.Release(ctx, a.cfg.Cgroup.Root, a.scope.scope); err != nil {
		a.log.Error("release the cells' systemd scope", zap.Error(err))
	} else {
		a.log.Info("cells' systemd scope released", zap.String("scope", a.scope.scope.Name))
	}
}

// closeScope closes the bus connection.
func (a *Agent) closeScope() {
	if a.scope != nil {
		a.scope.conn.Close()
	}
}
