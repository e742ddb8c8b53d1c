package controlapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/fleet"
	"cellvisor/controlapi/store"
	"cellvisor/manifest"
)

// fleetReader is the fleet page's view of the store, with this replica's
// sightings of the edges (not yet written) laid over it.
type fleetReader struct {
	s  *Server
	rt *runtimeSummary
}

func newFleetReader(s *Server) fleetReader { return fleetReader{s: s, rt: &runtimeSummary{}} }

func (f fleetReader) Runtimes(ctx context.Context, limit int) (fleet.Runtimes, error) {
	return f.rt.read(ctx, f.s.st, limit)
}

var _ fleet.Reader = fleetReader{}

func (f fleetReader) CountEdges(ctx context.Context) (int, error) { return f.s.st.CountEdges(ctx) }

func (f fleetReader) CountSilent(ctx context.Context, before time.Time) (int, error) {
	silent, err := f.s.st.SilentEdges(ctx, before)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range silent {
		if f.s.cache.lastSeen(id).Before(before) {
			n++ // not seen here since either
		}
	}
	return n, nil
}

func (f fleetReader) Edges(ctx context.Context, q fleet.Query) ([]adminapi.EdgeView, error) {
	edges, err := f.s.st.EdgesPage(ctx, store.EdgeFilter{After: q.After, Limit: q.Limit, SilentBefore: q.SilentBefore})
	if err != nil {
		return nil, err
	}
	out := make([]adminapi.EdgeView, 0, len(edges))
	for _, e := range edges {
		out = append(out, f.s.view(e, nil))
	}
	return out, nil
}

func (f fleetReader) Edge(ctx context.Context, id string) (adminapi.EdgeView, error) {
	_, v, err := f.s.edgeDetail(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return v, fmt.Errorf("%w: %w", fleet.ErrNotFound, err)
	}
	return v, err
}

func (f fleetReader) FailingMoves(ctx context.Context, limit int) ([]adminapi.MoveView, error) {
	moves, err := f.s.st.FailingMoves(ctx, limit)
	if err != nil {
		return nil, err
	}
	var out []adminapi.MoveView
	for _, m := range moves {
		out = append(out, *moveView(m))
	}
	return out, nil
}

// EgressHolders lists the current holders: a lease past its expiry is
// nobody's, and is not shown.
func (f fleetReader) EgressHolders(ctx context.Context, now time.Time, limit int) ([]fleet.EgressHolder, int, error) {
	ls, total, err := f.s.st.HeldLeases(ctx, now, limit)
	if err != nil {
		return nil, 0, err
	}
	out := make([]fleet.EgressHolder, 0, len(ls))
	for _, l := range ls {
		out = append(out, fleet.EgressHolder{Org: l.Org, Class: l.Class, EdgeID: l.Holder, EdgeName: l.HolderName,
			Region: fleet.RegionZone(l.Region, l.Zone), Epoch: l.Epoch, Until: l.ExpiresAt})
	}
	return out, total, nil
}

func (f fleetReader) Refusals(ctx context.Context, limit int) ([]fleet.Refusal, error) {
	acks, err := f.s.st.RecentAcks(ctx, manifest.AckRefused, limit)
	if err != nil {
		return nil, err
	}
	out := make([]fleet.Refusal, 0, len(acks))
	for _, a := range acks {
		out = append(out, fleet.Refusal(a))
	}
	return out, nil
}
