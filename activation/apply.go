package activation

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/atomicfile"
	"cellvisor/internal/backoff"
	"cellvisor/manifest"
	"cellvisor/runtime"
)

// apply installs and switches the changed slots, gives every slot its
// assignment, has the changed cells take their release (loaded as data or
// reloaded), retires the unassigned ones, waits
// for the cells to report the sequence, persists signed assignments, journals
// the ack, and only then records the sequence as active: a crash anywhere
// before that redoes the activation (a no-op on disk) and the ack.
func (a *Activator) apply(ctx context.Context, seq int64, pl placement) error {
	views, err := a.survey(ctx, seq, pl)
	if err != nil {
		return err
	}
	changes := plan(seq, views)
	if err := a.installAndSwitch(seq, changes); err != nil {
		return err
	}
	want := map[string]int64{}
	how := map[string]string{}
	var retiring []runtime.Slot
	for _, c := range changes { // in slot order, not the map's
		switch c.kind {
		case retire:
			retiring = append(retiring, c.slot)
			continue
		case untouched:
			// An assigned slot whose release is already right may still
			// need its pool said (a cold start that waited for it).
			if pool := pl.assign[c.slot.Name]; pool != "" {
				if err := a.o.Cells.Assign(ctx, c.slot.Name, pool); err != nil {
					a.log.Warn("assign cell", zap.String("cell", c.slot.Name), zap.Error(err))
				}
			}
			continue
		}
		want[c.slot.Name] = c.want
		if err := a.o.Cells.Assign(ctx, c.slot.Name, pl.assign[c.slot.Name]); err != nil {
			a.log.Warn("assign cell", zap.String("cell", c.slot.Name), zap.Error(err))
		}
		actx, cancel := context.WithTimeout(ctx, 2*cellCallTimeout)
		h, err := a.o.Cells.Apply(actx, c.slot.Name)
		cancel()
		how[c.slot.Name] = h
		if err != nil {
			a.log.Warn("apply release to cell", zap.String("cell", c.slot.Name), zap.Error(err))
		}
	}
	notRetired := a.retire(ctx, retiring)
	missing := a.awaitLoaded(ctx, want)
	if pl.signed {
		if err := runtime.SavePlacement(a.o.StateDir, a.o.Topology, pl.assign, pl.limits); err != nil {
			return fmt.Errorf("persist assignments of %d: %w", seq, err)
		}
	}
	a.mu.Lock()
	a.assign, a.limits = pl.assign, pl.limits
	a.mu.Unlock()
	return a.commit(seq, changes, how, missing, notRetired)
}

// retire unassigns slots: each cell is drained and stopped (within the
// apply timeout), then its runtime emptied. It returns the cells that could
// not be stopped or emptied, which keep their runtime.
func (a *Activator) retire(ctx context.Context, slots []runtime.Slot) []string {
	var failed []string
	for _, s := range slots {
		rctx, cancel := context.WithTimeout(ctx, a.o.ApplyTimeout)
		err := a.o.Cells.Assign(rctx, s.Name, "")
		cancel()
		if err == nil {
			err = runtime.Clear(s)
		}
		if err != nil {
			a.log.Error("retire unassigned cell", zap.String("cell", s.Name), zap.Error(err))
			failed = append(failed, s.Name)
			continue
		}
		a.log.Info("cell unassigned: stopped, runtime emptied", zap.String("cell", s.Name))
	}
	return failed
}

// survey builds every assigned slot's release for seq and reads what every
// slot has now: its active release and what its cell reports. It writes
// nothing.
func (a *Activator) survey(ctx context.Context, seq int64, pl placement) ([]slotView, error) {
	a.mu.Lock()
	before := a.assign
	a.mu.Unlock()
	views := make([]slotView, 0, len(a.o.Topology.Slots))
	for _, s := range a.o.Topology.Slots {
		v := slotView{slot: s, pool: pl.assign[s.Name], before: before[s.Name]}
		if v.pool != "" {
			p := a.o.Render(s, v.pool, seq)
			p.Limits = pl.limits[v.pool]
			r, err := runtime.BuildRelease(p, pl.slots[s.Name])
			if err != nil {
				return nil, err
			}
			v.next = r
		}
		if cur, err := runtime.Current(s); err == nil {
			v.current, v.hasCurrent = cur, true
		}
		if loaded, running, err := a.loaded(ctx, s.Name); err == nil {
			v.loaded, v.running = loaded, running
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

// runtimes are the runtimes of the running cells of the plan, in slot
// order, for an ack; nil when Cells cannot tell.
func (a *Activator) runtimes(changes []change) []manifest.CellRuntime {
	rt, ok := a.o.Cells.(RuntimeTeller)
	if !ok {
		return nil
	}
	var out []manifest.CellRuntime
	for _, c := range changes {
		if c.kind == retire {
			continue
		}
		if v, superseded, ok := rt.RuntimeOf(c.slot.Name); ok {
			r := manifest.CellRuntime{Cell: c.slot.Name, Version: v, Superseded: superseded}
			if manifest.CheckRuntimes([]manifest.CellRuntime{r}) != nil {
				r.Version = "" // what a binary printed, not a version: unknown
			}
			out = append(out, r)
		}
	}
	return out
}

// commit journals the ack of seq (partial when cells did not report it)
// and then records seq as the active sequence.
func (a *Activator) commit(seq int64, changes []change, how map[string]string, missing, notRetired []string) error {
	ack := manifest.Ack{Sequence: seq, Status: manifest.AckApplied, At: a.clock.Now().UTC(), Runtimes: a.runtimes(changes)}
	var why []string
	if len(missing) > 0 {
		why = append(why, fmt.Sprintf("release %d is active but %d cell(s) have not reported loading it (%s)", seq, len(missing), strings.Join(missing, ", ")))
	}
	if len(notRetired) > 0 {
		why = append(why, fmt.Sprintf("%d unassigned cell(s) could not be stopped (%s)", len(notRetired), strings.Join(notRetired, ", ")))
	}
	if len(why) > 0 {
		cells := append(slices.Clone(missing), notRetired...)
		sort.Strings(cells)
		ack.Status, ack.Cells, ack.Reason = manifest.AckPartial, cells, strings.Join(why, "; ")
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
	a.note(seq, ack.Status)
	var loaded, reloaded, started, retired []string
	for _, c := range changes {
		switch h := how[c.slot.Name]; {
		case c.kind == retire:
			retired = append(retired, c.slot.Name)
		case c.kind == untouched:
		case h == "loaded":
			loaded = append(loaded, c.slot.Name)
		case h == "started":
			started = append(started, c.slot.Name)
		default:
			reloaded = append(reloaded, c.slot.Name+" ("+h+")")
		}
	}
	a.log.Info("manifest applied", zap.Int64("sequence", seq), zap.Strings("loaded", loaded), zap.Strings("reloaded", reloaded),
		zap.Strings("started", started), zap.Strings("retired", retired), zap.String("ack", ack.Status), zap.Strings("not_loaded", missing))
	return nil
}

// cellCallTimeout bounds each question to a cell about what it loaded: a
// cell that does not answer (hung, until its liveness checks restart it)
// must hold back neither the other cells nor the ack.
const cellCallTimeout = time.Second

// loaded asks a cell what it has loaded, within cellCallTimeout.
func (a *Activator) loaded(ctx context.Context, name string) (int64, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, cellCallTimeout)
	defer cancel()
	return a.o.Cells.Loaded(ctx, name)
}

// awaitLoaded waits until every cell in want reports its sequence, and
// returns the ones that did not within the apply timeout. Each round asks
// the cells still waited for at once, each within cellCallTimeout.
func (a *Activator) awaitLoaded(ctx context.Context, want map[string]int64) []string {
	ctx, cancel := context.WithTimeout(ctx, a.o.ApplyTimeout)
	defer cancel()
	waiting := maps.Clone(want)
	b := &backoff.Backoff{Initial: 2 * time.Millisecond, Max: 100 * time.Millisecond, Clock: a.clock}
	for len(waiting) > 0 {
		var (
			mu   sync.Mutex
			wg   sync.WaitGroup
			done []string
		)
		for name, seq := range waiting {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if got, running, err := a.loaded(ctx, name); err == nil && running && got == seq {
					mu.Lock()
					done = append(done, name)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for _, name := range done {
			delete(waiting, name)
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
