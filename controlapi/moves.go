package controlapi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/domain"
)

// retarget is the store's Rebuilder: a domain's artifact for another pool
// at a new revision, its configuration unchanged, validated as a publish
// is.
func retarget(artifact []byte, pool string, revision int64) ([]byte, error) {
	d, err := domain.Decode(artifact)
	if err != nil {
		return nil, fmt.Errorf("current artifact: %w", err)
	}
	name := d.Domain
	d.Pool, d.Revision = "", 0
	config, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	_, data, err := domainArtifact(name, pool, config, revision)
	return data, err
}

// nudgeMoves wakes the move loop without waiting for it.
func (s *Server) nudgeMoves() {
	select {
	case s.moveNudge <- struct{}{}:
	default:
	}
}

// runMoves drives every move under way one step at a time, on a ticker
// and whenever an ack or a status report arrives. The store is the source
// of truth and every step is a compare-and-set in a transaction, so any
// number of replicas may run it at once.
func (s *Server) runMoves(ctx context.Context) {
	tick := time.NewTicker(s.o.MoveTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.moveNudge:
		}
		s.stepMoves(ctx)
	}
}

// stepMoves takes every step the moves and cell drains under way can take
// now.
func (s *Server) stepMoves(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	changed := s.stepDrains(ctx)
	domains, err := s.st.ActiveMoves(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("list moves", zap.Error(err))
		}
		if changed {
			s.refresh(ctx)
		}
		return
	}
	for _, d := range domains {
		before, _ := s.st.Move(ctx, d)
		m, waiting, err := s.st.StepMove(ctx, d, s.sign, retarget)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("move step", zap.String("domain", d), zap.Error(err))
			}
			continue
		}
		if m.State == before.State {
			continue
		}
		changed = true
		log := s.log.Info
		if m.State == adminapi.MoveFailed {
			log = s.log.Warn
		}
		log("move", zap.String("domain", d), zap.String("from", m.From), zap.String("to", m.To), zap.String("state", m.State),
			zap.String("reason", m.Reason), zap.String("waiting_for", waiting))
	}
	if changed {
		s.refresh(ctx)
	}
}

// stepDrains takes every step the cell drains under way can take now and
// reports whether one changed state.
func (s *Server) stepDrains(ctx context.Context) bool {
	keys, err := s.st.ActiveDrains(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("list cell drains", zap.Error(err))
		}
		return false
	}
	changed := false
	for _, k := range keys {
		edge, cell := k[0], k[1]
		before, _ := s.st.Drain(ctx, edge, cell)
		d, waiting, err := s.st.StepDrain(ctx, edge, cell, s.sign)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("cell drain step", zap.String("edge", edge), zap.String("cell", cell), zap.Error(err))
			}
			continue
		}
		if d.State == before.State {
			continue
		}
		changed = true
		log := s.log.Info
		if d.State == adminapi.MoveFailed {
			log = s.log.Warn
		}
		log("cell drain", zap.String("edge", edge), zap.String("cell", cell), zap.String("from", d.From), zap.String("to", d.To),
			zap.String("state", d.State), zap.String("reason", d.Reason), zap.String("waiting_for", waiting))
	}
	return changed
}
