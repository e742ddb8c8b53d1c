package supervisor

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/cgroup"
	"cellvisor/runtime"
)

// The start pass: Prepare makes the assigned slots' groups and binds
// their ports early while the agent finishes its start-up, then Run's
// startAll starts every cell that is to run now, before the slots'
// routines supervise them.

// Prepare readies the assigned slots' first starts while the caller
// finishes its own start-up (the agent checks its releases meanwhile),
// instead of after it: PrepareGroups, then BindEarly. The agent calls the
// two apart, BindEarly once its releases are verified and built.
//
// Nothing is bound or made under a refusal, and no group without enforced
// limits. Call it (or the two) at most once, before Run; a caller that
// will not Run after all calls Unprepare.
func (s *Supervisor) Prepare() {
	s.PrepareGroups()
	s.BindEarly()
}

// PrepareGroups begins making, on a goroutine of its own and one slot
// after the other, the cgroup of every assigned slot that has none yet
// (every one on a host's cold start), on a CPU that would otherwise idle:
// Run's start pass takes each group as it is made. A group that exists (a
// previous agent's) is left to Run's recovery.
func (s *Supervisor) PrepareGroups() {
	if s.o.Refusal != nil || s.o.Cgroups.Mode() == cgroup.ModeUnenforced {
		return
	}
	names, err := s.o.Cgroups.List()
	if err != nil {
		return // Run's recovery lists them again, and says why it cannot
	}
	var todo []*slot
	for _, c := range s.assigned() {
		if !slices.Contains(names, c.spec.Name) {
			c.prepared = make(chan struct{})
			todo = append(todo, c)
		}
	}
	go func() {
		for _, c := range todo {
			s.makeGroup(c)
			close(c.prepared)
		}
	}()
}

// BindEarly binds each assigned slot's public ports where its active
// release listens (bindEarly): from then on a client's connection waits in
// the listen backlog until the cell answers it, rather than being refused
// until the start pass reaches the slot.
func (s *Supervisor) BindEarly() {
	if s.o.Refusal != nil {
		return
	}
	for _, c := range s.assigned() {
		c.bindEarly()
	}
}

// assigned are the slots with a pool.
func (s *Supervisor) assigned() []*slot {
	var out []*slot
	for _, c := range s.slots {
		c.mu.Lock()
		if c.pool != "" {
			out = append(out, c)
		}
		c.mu.Unlock()
	}
	return out
}

// Unprepare closes the ports Prepare bound, waits for its groups and
// removes them: for a caller that prepared and will not Run. Nothing had
// started in them.
func (s *Supervisor) Unprepare() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range s.slots {
		c.dropEarly()
		if c.prepared == nil {
			continue
		}
		<-c.prepared
		c.mu.Lock()
		g := c.group
		c.group, c.fresh = nil, nil
		c.mu.Unlock()
		if g != nil {
			if err := g.Delete(ctx); err != nil {
				c.log.Warn("remove cell cgroup", zap.Error(err))
			}
		}
	}
}

// makeGroup creates (or updates) c's group with the current limits and
// keeps it, and the limits as fresh, for c's next start. A failure is left
// to that start, which tries again and reports it.
func (s *Supervisor) makeGroup(c *slot) {
	l := s.settings().Limits
	g, err := s.o.Cgroups.Ensure(c.spec.Name, l)
	if err != nil {
		c.log.Warn("create cell cgroup", zap.Error(err))
		return
	}
	c.mu.Lock()
	c.group, c.fresh = g, &l
	c.mu.Unlock()
}

// createGroups creates the cgroups of the slots about to start a cell, one
// after the other, and hands each slot to made once its group is there
// (or could not be made: a failure is left to the slot's own start, which
// tries again and reports it); a group Prepare makes is handed on once
// made. It closes made when done. One goroutine: the kernel takes the
// global cgroup_mutex for every mkdir, so goroutines creating groups side
// by side only spun on it (docs/performance.md, round 6).
func (s *Supervisor) createGroups(starting []*slot, made chan<- *slot) {
	defer close(made)
	enforced := s.o.Cgroups.Mode() != cgroup.ModeUnenforced
	for _, c := range starting {
		switch {
		case c.prepared != nil:
			<-c.prepared
		case enforced:
			s.makeGroup(c)
		}
		made <- c
	}
}

// startAll starts every cell that is to run now, before the slots'
// routines run, each of which then supervises the master started for it;
// each cell as soon as its group is made (createGroups, beside it), so the
// first cells are exec'd while the last groups are still being created.
// Eight routines starting their own cells also waited on one another's
// scheduling between their few syscalls each (docs/performance.md, rounds
// 4 to 6); the pass is spawners goroutines taking the cells in slot order.
// A cell this pass cannot start is left to its routine, which starts it
// again and reports why it cannot.
func (s *Supervisor) startAll(starting []*slot) {
	made := make(chan *slot, len(starting))
	go s.createGroups(starting, made)
	var wg sync.WaitGroup
	for range spawners {
		wg.Go(func() {
			for c := range made {
				if p, err := c.start(); err == nil {
					c.started = p
				}
			}
		})
	}
	wg.Wait()
	// What recovery found vacant is trusted for this pass only: a slot
	// that starts later reads its group as every start does. Prepare is
	// done with every slot before the slots' routines run.
	for _, c := range s.slots {
		if c.prepared != nil {
			<-c.prepared
		}
		c.vacant = false
		c.dropEarly() // not started (adopted, nothing to start) or failed first
	}
}

// spawners is how many cells startAll execs side by side. An exec blocks
// the thread that forks (and the runtime's P on it) until the child has
// exec'd, and a new child waits for a CPU behind the cells already
// starting, for up to a scheduler slice (milliseconds on a busy two-CPU
// host): from one goroutine, every later cell waited on it. From two, a
// child that waits holds up its own cell only, while the other spawner goes
// on (docs/performance.md, round 13). Each slot is started by one spawner.
// Two is what a two-CPU host can run at once (one P per CPU); a third
// would only wait for a P that a fork holds.
const spawners = 2

// startingSlots are the slots whose cells Run starts as it begins: none
// under a refusal, else those assigned, with a release, and no master
// adopted for them.
func (s *Supervisor) startingSlots() []*slot {
	if s.o.Refusal != nil {
		return nil
	}
	var out []*slot
	for _, c := range s.slots {
		c.mu.Lock()
		skip := c.pool == "" || c.adopted != nil
		c.mu.Unlock()
		if skip {
			continue
		}
		if _, err := runtime.Current(c.spec); err == nil {
			out = append(out, c)
		}
	}
	return out
}
