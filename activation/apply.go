package activation

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/atomicfile"
	"cellvisor/internal/backoff"
	"cellvisor/manifest"
	"cellvisor/runtime"
)

// apply installs and switches the changed slots, reloads their cells,
// waits for them to report the sequence, journals the ack, and only then
// records the sequence as active: a crash anywhere before that redoes the
// activation (a no-op on disk) and the ack.
func (a *Activator) apply(ctx context.Context, seq int64, pools map[string]*runtime.PoolRuntime) error {
	views, err := a.survey(ctx, seq, pools)
	if err != nil {
		return err
	}
	changes := plan(seq, views)
	if err := a.installAndSwitch(seq, changes); err != nil {
		return err
	}
	want := map[string]int64{}
	for _, c := range changes { // in slot order, not the map's
		if c.kind == untouched {
			continue
		}
		want[c.slot.Name] = c.want
		if err := a.o.Cells.Reload(c.slot.Name); err != nil {
			a.log.Warn("reload cell", zap.String("cell", c.slot.Name), zap.Error(err))
		}
	}
	missing := a.awaitLoaded(ctx, want)
	return a.commit(seq, changes, missing)
}

// survey builds every assigned slot's release for seq and reads what the
// slot has now: its active release and what its cell reports. It writes
// nothing.
func (a *Activator) survey(ctx context.Context, seq int64, pools map[string]*runtime.PoolRuntime) ([]slotView, error) {
	views := make([]slotView, 0, len(a.o.Topology.Slots))
	for _, s := range a.o.Topology.Slots {
		v := slotView{slot: s, pool: a.o.Assignments[s.Name]}
		if v.pool != "" {
			r, err := runtime.BuildRelease(a.o.Render(s, v.pool, seq), pools[v.pool])
			if err != nil {
				return nil, err
			}
			v.next = r
			if cur, err := runtime.Current(s); err == nil {
				v.current, v.hasCurrent = cur, true
				if loaded, running, err := a.o.Cells.Loaded(ctx, s.Name); err == nil {
					v.loaded, v.running = loaded, running
				}
			}
		}
		views = append(views, v)
	}
	return views, nil
}

// installAndSwitch writes every new release of the plan, then switches each
// slot to its own: nothing is switched unless every release is written.
func (a *Activator) installAndSwitch(seq int64, changes []change) error {
	for _, c := range changes {
		if c.kind != install {
			continue
		}
		if _, err := runtime.Install(c.slot, c.release); err != nil {
			return fmt.Errorf("activate release %d: %w", seq, err)
		}
	}
	for _, c := range changes {
		if c.kind != install {
			continue
		}
		if err := runtime.Switch(c.slot, c.release.Meta.ID); err != nil {
			return fmt.Errorf("activate release %d: %w", seq, err)
		}
		if err := runtime.Prune(c.slot); err != nil {
			a.log.Warn("prune releases", zap.String("cell", c.slot.Name), zap.Error(err))
		}
	}
	return nil
}

// commit journals the ack of seq (partial when cells did not report it)
// and then records seq as the active sequence.
func (a *Activator) commit(seq int64, changes []change, missing []string) error {
	ack := manifest.Ack{Sequence: seq, Status: manifest.AckApplied, At: a.clock.Now().UTC()}
	if len(missing) > 0 {
		ack.Status, ack.Cells = manifest.AckPartial, missing
		ack.Reason = fmt.Sprintf("release %d is active but %d cell(s) have not reported loading it", seq, len(missing))
	}
	if err := a.o.Journal.Append(ack); err != nil {
		return err
	}
	if err := a.commitRevisions(seq); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(a.activePath(), []byte(fmt.Sprintf(`{"sequence":%d}`+"\n", seq)), 0o644); err != nil {
		return fmt.Errorf("record active sequence %d: %w", seq, err)
	}
	a.mu.Lock()
	a.active = seq
	a.mu.Unlock()
	var names []string
	for _, c := range changes {
		if c.kind == install {
			names = append(names, c.slot.Name)
		}
	}
	a.log.Info("manifest applied", zap.Int64("sequence", seq), zap.Strings("reloaded", names), zap.String("ack", ack.Status), zap.Strings("not_loaded", missing))
	return nil
}

// awaitLoaded waits until every cell in want reports its sequence, and
// returns the ones that did not within the apply timeout.
func (a *Activator) awaitLoaded(ctx context.Context, want map[string]int64) []string {
	ctx, cancel := context.WithTimeout(ctx, a.o.ApplyTimeout)
	defer cancel()
	waiting := maps.Clone(want)
	b := &backoff.Backoff{Initial: 2 * time.Millisecond, Max: 100 * time.Millisecond, Clock: a.clock}
	for len(waiting) > 0 {
		for name, seq := range waiting {
			if got, running, err := a.o.Cells.Loaded(ctx, name); err == nil && running && got == seq {
				delete(waiting, name)
			}
		}
		if len(waiting) == 0 {
			break
		}
		if b.Wait(ctx) != nil {
			out := make([]string, 0, len(waiting))
			for name := range waiting {
				out = append(out, name)
			}
			sort.Strings(out)
			return out
		}
	}
	return nil
}
