package supervisor

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"cellvisor/internal/atomicfile"
	"cellvisor/internal/sysfile"
	"cellvisor/runtime"
)

// The agent's watch of what each cell holds on disk (issue 39): the cache,
// request bodies and logs, measured from the files there and the cell's
// open ones, for status and metrics, with an action when the cache goes
// over. nginx's cache manager keeps the cache to max_size (the budget's
// target, runtime.CacheTarget) but looks only every 10 s while the cache
// was under it when it last looked; a cell filling its cache at tens of MiB
// a second would hold several times its budget in between. The watch
// measures every cell every diskInterval and, when the cache is over its
// target, wakes the manager: it ends the cell's cache manager process,
// which nginx's master starts again at once, and a new manager removes the
// least recently used entries down to the target before it first sleeps.

// DiskUse is what a cell holds on disk against each of its budgets.
type DiskUse struct {
	Cache      DiskBudget `json:"cache"`
	RequestTmp DiskBudget `json:"request_tmp"`
	Logs       DiskBudget `json:"logs"`
	// CacheWakes counts the times the agent woke the cell's cache manager
	// because the cache was over its target, since the agent started.
	CacheWakes int64 `json:"cache_wakes"`
	// MeasuredAt is when the figures were read.
	MeasuredAt time.Time `json:"measured_at"`
}

// DiskBudget is one budget and what is held against it.
type DiskBudget struct {
	// Bytes are held on disk now: the blocks of the files there and of the
	// cell's open files there, unlinked ones included.
	Bytes int64 `json:"bytes"`
	// Unlinked are the part of Bytes in files no longer in the directory,
	// kept only by the cell's open descriptors (du does not see them).
	Unlinked int64 `json:"unlinked"`
	Budget   int64 `json:"budget"`
}

// diskInterval is the least time between two measures of a cell; a measure
// that looks at many entries (a cache of many small files) spaces them
// more, diskEntryCost each, so that the watch takes about 2 % of a CPU per
// cell: a look costs up to 6 µs an entry (BenchmarkHeldDirs, on a loaded
// machine), so 1,000 entries are looked at every 300 ms, a cache of 5,000
// files in 4,096 directories every 2.7 s.
const (
	diskInterval    = 100 * time.Millisecond
	diskMaxInterval = 30 * time.Second
	diskEntryCost   = 300 * time.Microsecond
)

// diskState is a slot's latest measure.
type diskState struct {
	mu    sync.Mutex // guards the following fields
	use   *DiskUse
	wakes int64
	// overLogged is when the watch last logged a budget over, by budget,
	// so that a cell over for long logs once a minute.
	overLogged map[string]time.Time
	// cacheBefore is the cache's bytes at the measure before.
	cacheBefore int64
}

// wakeDue says whether the cache manager is to be woken with the cache at
// bytes, over its target: only when the cache grew since the measure
// before. A cache over its target that does not grow is one the manager
// is emptying, or one where it has nothing to remove: every entry in use,
// or, in the first minute after a start, files from before it that the
// manager knows only once its cache loader has run.
func (d *diskState) wakeDue(bytes int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return bytes > d.cacheBefore
}

// woke counts a wake.
func (d *diskState) woke() {
	d.mu.Lock()
	d.wakes++
	d.mu.Unlock()
}

func (d *diskState) snapshot() *DiskUse {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.use == nil {
		return nil
	}
	u := *d.use
	u.CacheWakes = d.wakes
	return &u
}

// watchDisk measures the slot's cell until ctx ends.
func (c *slot) watchDisk(ctx context.Context) {
	for {
		entries := c.measureDisk()
		wait := max(diskInterval, time.Duration(entries)*diskEntryCost)
		t := c.s.clk.NewTimer(min(wait, diskMaxInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// measureDisk measures the cell once, records it, and wakes the cache
// manager when the cache is over its target. It returns how many entries
// it looked at.
func (c *slot) measureDisk() int {
	c.mu.Lock()
	g, pid, pool := c.group, c.pid, c.pool
	c.mu.Unlock()
	if pool == "" {
		return 0
	}
	var pids []int
	if g != nil && pid != 0 {
		pids, _ = g.Procs()
	}
	o := c.s.o
	dirs := []string{c.spec.CacheDir(), c.spec.RequestTmpDir(), c.spec.LogsDir()}
	var h []held
	var entries int
	err := c.readAsCell(func() (err error) {
		h, entries, err = heldDirs(dirs, pids)
		return err
	})
	if err != nil {
		c.log.Debug("measure disk use", zap.Error(err))
		return entries
	}
	use := &DiskUse{
		Cache:      DiskBudget{Bytes: h[0].bytes, Unlinked: h[0].unlinked, Budget: o.CacheBudget},
		RequestTmp: DiskBudget{Bytes: h[1].bytes, Unlinked: h[1].unlinked, Budget: o.RequestBudget},
		Logs:       DiskBudget{Bytes: h[2].bytes, Unlinked: h[2].unlinked, Budget: o.LogBudget},
		MeasuredAt: c.s.clk.Now(),
	}
	wake := use.Cache.Bytes > runtime.CacheTarget(o.CacheBudget) && pid != 0 && c.disk.wakeDue(use.Cache.Bytes)
	c.disk.mu.Lock()
	c.disk.use, c.disk.cacheBefore = use, use.Cache.Bytes
	c.disk.mu.Unlock()
	if o.CacheBudget > 0 && pid != 0 {
		// The cell stores an answer only while this and what it stored
		// since leave room in the budget (the Lua's cache_room).
		line := fmt.Appendf(nil, "%d %d\n", use.Cache.Bytes, use.MeasuredAt.UnixMilli())
		if err := atomicfile.Replace(c.spec.CacheUseFile(), line, 0o644); err != nil {
			c.log.Debug("write the cache's use for the cell", zap.Error(err))
		}
	}
	if wake {
		if err := c.wakeCacheManager(pid); err != nil {
			c.log.Debug("wake the cache manager", zap.Error(err))
		} else {
			c.disk.woke()
		}
	}
	c.logOver("cache", use.Cache)
	c.logOver("request_tmp", use.RequestTmp)
	return entries
}

// logOver logs a budget held over by more than a tenth, once a minute.
func (c *slot) logOver(name string, b DiskBudget) {
	if b.Budget == 0 || b.Bytes <= b.Budget+b.Budget/10 {
		return
	}
	now := c.s.clk.Now()
	c.disk.mu.Lock()
	last := c.disk.overLogged[name]
	if now.Sub(last) < time.Minute {
		c.disk.mu.Unlock()
		return
	}
	if c.disk.overLogged == nil {
		c.disk.overLogged = map[string]time.Time{}
	}
	c.disk.overLogged[name] = now
	c.disk.mu.Unlock()
	c.log.Warn("cell over its disk budget", zap.String("budget", name), zap.Int64("bytes", b.Bytes),
		zap.Int64("unlinked", b.Unlinked), zap.Int64("limit", b.Budget))
}

// cacheManagerTitle is how nginx titles its cache manager process.
const cacheManagerTitle = "nginx: cache manager process"

// wakeCacheManager ends the master's cache manager process (SIGTERM: it
// exits at once, between two of its passes), which the master starts again
// at once; the new one runs its first pass without waiting. The process is
// named by a pidfd taken before its title is checked, so a pid reused
// meanwhile is never signalled.
func (c *slot) wakeCacheManager(master int) error {
	kids, err := childrenAsCell(c, master)
	if err != nil {
		return err
	}
	for _, k := range kids {
		if strings.HasPrefix(c.title(k.pid), cacheManagerTitle) {
			return c.signalChild(k, cacheManagerTitle, unix.SIGTERM)
		}
	}
	return fmt.Errorf("cell master %d has no cache manager", master)
}

// title is a process's title (its command line as nginx rewrote it), ""
// when it cannot be read.
func (c *slot) title(pid int) string {
	var b []byte
	_ = c.readAsCell(func() (err error) {
		b, err = sysfile.ReadFile(procfs.PIDPath(pid, "cmdline"), 1<<16)
		return err
	})
	return strings.TrimRight(string(b), "\x00 ")
}

// signalChild signals k through a pidfd once it is sure the pidfd names k
// (same start time) and k still has the title.
func (c *slot) signalChild(k procID, title string, sig unix.Signal) error {
	fd, err := unix.PidfdOpen(k.pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd of %d: %w", k.pid, err)
	}
	defer unix.Close(fd)
	var start uint64
	_ = c.readAsCell(func() error {
		var ok bool
		if start, ok = startTime(k.pid); !ok {
			return fmt.Errorf("process %d gone", k.pid)
		}
		return nil
	})
	if start != k.start || !strings.HasPrefix(c.title(k.pid), title) {
		return fmt.Errorf("process %d is no longer the %s", k.pid, title)
	}
	if err := c.asCell(func() error { return unix.PidfdSendSignal(fd, sig, nil, 0) }); err != nil {
		return fmt.Errorf("signal %s %d: %w", title, k.pid, err)
	}
	return nil
}

// childrenAsCell lists the master's children, as the agent or the cell's
// user.
func childrenAsCell(c *slot, pid int) (kids []procID, err error) {
	err = c.readAsCell(func() (err error) {
		kids, err = children(pid)
		return err
	})
	return kids, err
}
