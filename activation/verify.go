package activation

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"sync"
	"sync/atomic"

	"cellvisor/domain"
	"cellvisor/manifest"
	"cellvisor/runtime"
)

// verify fetches every artifact and checks it against its signed entry,
// decodes it, and compiles the pools. It installs nothing: the verified
// documents wait in a spill file (see docSpill) that the pools read from
// until done is called, once the activation is over.
func (a *Activator) verify(ctx context.Context, m manifest.Manifest, fetch func(context.Context, string) ([]byte, error)) (pl placement, done func(), err error) {
	if pl, err = a.placementOf(m); err != nil {
		return placement{}, nil, err
	}
	spill, err := newDocSpill(a.o.StateDir)
	if err != nil {
		return placement{}, nil, err
	}
	defer func() {
		if err != nil {
			spill.close()
		}
	}()
	// Verification and decoding are CPU-bound and independent per entry: they
	// run on as many workers as the runtime has processors (Go sizes
	// GOMAXPROCS from the agent's cgroup CPU limit). The first error in
	// entry order is the one reported.
	encKeys, err := a.encryptionKeys(m)
	if err != nil {
		return placement{}, nil, err
	}
	domains := make([]domain.Domain, len(m.Entries))
	keys := make([][]byte, len(m.Entries)) // opened certificate keys, by entry
	opened := &openedKeys{keys: map[string][]byte{}}
	errs := make([]error, len(m.Entries))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64 // the next entry to claim
	var wg sync.WaitGroup
	for range max(goruntime.GOMAXPROCS(0), 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(m.Entries) {
					return
				}
				domains[i], errs[i] = a.verifyEntry(ctx, m.Entries[i], fetch)
				if errs[i] == nil {
					keys[i], errs[i] = a.openKey(encKeys, m.Entries[i], &domains[i], opened)
				}
				if errs[i] == nil {
					domains[i], errs[i] = spill.put(domains[i])
				}
				if errs[i] != nil {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return placement{}, nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return placement{}, nil, err
	}
	pools, err := runtime.CompilePools(domains)
	if err != nil {
		return placement{}, nil, err
	}
	spill.attach(pools)
	for i, k := range keys {
		if k == nil {
			continue
		}
		p := pools[domains[i].Pool]
		if p.Keys == nil {
			p.Keys = map[string][]byte{}
		}
		p.Keys[domains[i].Domain] = k
	}
	cells := map[string][]string{}
	for _, e := range m.Entries {
		if len(e.Cells) > 0 {
			cells[e.Domain] = e.Cells
		}
	}
	pl.slots = runtime.CompileSlots(pools, pl.assign, cells)
	a.keep(opened)
	return pl, spill.close, nil
}

// verifyEntry fetches one artifact, verifies it against its entry and
// decodes it.
func (a *Activator) verifyEntry(ctx context.Context, e manifest.Entry, fetch func(context.Context, string) ([]byte, error)) (domain.Domain, error) {
	data, err := fetch(ctx, e.SHA256)
	if err != nil {
		return domain.Domain{}, fmt.Errorf("fetch artifact of %s: %w", e.Domain, err)
	}
	if err := e.Verify(a.PinnedKey(), a.o.EdgeID, data); err != nil {
		return domain.Domain{}, err
	}
	d, err := domain.Decode(data)
	if err != nil {
		return domain.Domain{}, fmt.Errorf("artifact of %s revision %d: %w", e.Domain, e.Revision, err)
	}
	if d.Domain != e.Domain || d.Pool != e.Pool || d.Revision != e.Revision {
		return domain.Domain{}, fmt.Errorf("%w: artifact says %s/%s revision %d, its entry %s/%s revision %d",
			manifest.ErrInvalid, d.Domain, d.Pool, d.Revision, e.Domain, e.Pool, e.Revision)
	}
	return compact(d), nil
}
