package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"cellvisor/internal/atomicfile"
	"cellvisor/internal/safefile"
	"cellvisor/internal/sysfile"
	"cellvisor/runtimebin"
)

// A package upgrade renames a new OpenResty binary over the configured path
// (dpkg, rpm). Running masters keep executing the file they started from,
// now unlinked: their /proc/PID/exe reads "PATH (deleted)". Such a master
// is still the one the agent recorded, and is adopted across an agent
// restart like any other; it runs a superseded runtime, which status,
// metrics and the log say, with the version it started with and the one
// the path holds now, until the cell is rolled onto the new binary
// (upgrade.go).

// binInfo is one binary file: its identity and the version it reports.
type binInfo struct {
	ID      runtimebin.ID
	Version string // "" while not known
}

// cellBin is what a running master executes.
type cellBin struct {
	binInfo
	// known says ID is the master's file (recorded at its start, or read
	// from /proc/PID/exe); a master whose file could not be told is never
	// called superseded.
	known bool
	// staleModules names a module (Options.Watch) the master maps though
	// it was replaced since (its last check, upgrade.go); "" for none.
	staleModules string
}

// staleModules names the first of modules that the process pid maps though
// the file was replaced since ("PATH (deleted)" in /proc/PID/maps); "" for
// none, or when the maps cannot be read.
func (c *slot) staleModules(pid int, modules []string) string {
	if len(modules) == 0 {
		return ""
	}
	var maps []byte
	err := c.readAsCell(func() (err error) {
		maps, err = sysfile.ReadFile(procfs.PIDPath(pid, "maps"), 4<<20)
		return err
	})
	if err != nil {
		return ""
	}
	real := make([]string, len(modules))
	for i, m := range modules {
		real[i] = inRealDir(m)
	}
	for line := range strings.Lines(string(maps)) {
		line = strings.TrimRight(line, "\n")
		for i, m := range modules {
			if strings.HasSuffix(line, " "+m+deletedSuffix) || strings.HasSuffix(line, " "+real[i]+deletedSuffix) {
				return m
			}
		}
	}
	return ""
}

// inRealDir is path with its directory's links resolved, as the kernel
// names a mapped file: Debian's /usr/share/nginx/modules is a link to
// /usr/lib/nginx/modules. The file itself is not resolved (it is the
// one replaced); path as it is when the directory cannot be resolved.
func inRealDir(path string) string {
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return path
	}
	return filepath.Join(dir, filepath.Base(path))
}

// runtimeRecord is written beside the master record when a master starts:
// the binary it exec'd, so that a next agent can tell the version a
// superseded master runs (the file is gone by then). A separate file, so
// that the master record an earlier agent reads (strictly) is unchanged.
type runtimeRecord struct {
	PID        int           `json:"pid"`
	StartTicks uint64        `json:"start_ticks"`
	Binary     runtimebin.ID `json:"binary"`
	Version    string        `json:"version,omitempty"`
}

func (c *slot) runtimeRecordPath() string {
	return filepath.Join(filepath.Dir(c.spec.PidFile()), "runtime.json")
}

// statBinary reads the configured binary's identity; the version is the
// known one's if the file is the same.
func (s *Supervisor) statBinary() (*binInfo, bool) {
	id, err := runtimebin.Stat(s.binary)
	if err != nil {
		return nil, false
	}
	if cur := s.bin.Load(); cur != nil && cur.ID == id {
		return cur, false
	}
	return &binInfo{ID: id}, true
}

// observeBinary stats the configured binary and, if the file changed,
// records it (its version not yet known) and wakes the runtime routine.
// It is cheap (one stat) and Status calls it: a replaced binary shows in
// status at once, whether or not a watch saw it.
func (s *Supervisor) observeBinary() *binInfo {
	b, changed := s.statBinary()
	if b == nil {
		return s.bin.Load()
	}
	if changed {
		s.bin.Store(b)
		s.kickRuntime()
	}
	return b
}

// learnVersion runs the configured binary's -v, if its version is not
// known yet, and completes the running masters' records of the same file.
func (s *Supervisor) learnVersion(ctx context.Context) {
	b := s.observeBinary()
	if b == nil || b.Version != "" {
		return
	}
	v, err := runtimebin.Version(ctx, s.binary)
	if err != nil {
		s.log.Warn("read the cells' runtime version", zap.Error(err))
		return
	}
	nb := &binInfo{ID: b.ID, Version: v}
	if !s.bin.CompareAndSwap(b, nb) {
		return // changed meanwhile: the next turn reads it
	}
	s.log.Info("cells' runtime", zap.String("binary", s.o.Binary), zap.String("version", v))
	for _, c := range s.slots {
		c.mu.Lock()
		fill := c.pid != 0 && c.bin.known && c.bin.ID == nb.ID && c.bin.Version == ""
		if fill {
			c.bin.Version = v
		}
		pid := c.pid
		c.mu.Unlock()
		if fill {
			c.rewriteRuntimeRecord(pid)
		}
	}
}

// startedBin records that the master just started executes the configured
// binary as last observed.
func (c *slot) startedBin() {
	b := c.s.observeBinary()
	c.mu.Lock()
	defer c.mu.Unlock()
	if b == nil {
		c.bin = cellBin{}
		return
	}
	c.bin = cellBin{binInfo: *b, known: true}
}

// writeRuntimeRecord records the binary the master pid (started at ticks)
// runs, beside its master record.
func (c *slot) writeRuntimeRecord(pid int, ticks uint64) {
	c.mu.Lock()
	b := c.bin
	c.mu.Unlock()
	if !b.known {
		c.removeRuntimeRecord()
		return
	}
	rec := runtimeRecord{PID: pid, StartTicks: ticks, Binary: b.ID, Version: b.Version}
	data, err := json.Marshal(rec)
	if err == nil {
		err = atomicfile.Replace(c.runtimeRecordPath(), append(data, '\n'), 0o600)
	}
	if err != nil {
		c.log.Warn("record the cell's runtime: a next agent cannot tell its version", zap.Error(err))
	}
}

// rewriteRuntimeRecord completes the runtime record of the running master
// pid with what the slot now knows of its binary.
func (c *slot) rewriteRuntimeRecord(pid int) {
	rec, err := c.readRuntimeRecord(context.Background())
	if err != nil || rec.PID != pid {
		return
	}
	c.writeRuntimeRecord(pid, rec.StartTicks)
}

func (c *slot) readRuntimeRecord(ctx context.Context) (runtimeRecord, error) {
	var rec runtimeRecord
	b, err := safefile.ReadFile(ctx, c.runtimeRecordPath(), maxSmallFile)
	if err != nil {
		return rec, err
	}
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&rec); err != nil {
		return rec, fmt.Errorf("%s: %w", c.runtimeRecordPath(), err)
	}
	return rec, nil
}

func (c *slot) removeRuntimeRecord() {
	if err := unix.Unlink(c.runtimeRecordPath()); err != nil && err != unix.ENOENT {
		c.log.Warn("remove cell runtime record", zap.String("path", c.runtimeRecordPath()), zap.Error(err))
	}
}

// errOtherExe says a master executes another file than the configured
// binary's path: the configured binary is a wrapper that execs the real one
// (as some tests' are), and whether the master's file was replaced cannot
// be told.
var errOtherExe = errors.New("the master executes another path than the configured binary")

// exeID is the identity of the file the process pid executes, replaced at
// its path or not (stat(2) of /proc/PID/exe follows it to the inode), if
// that file is (or was) the configured binary's path.
func (c *slot) exeID(pid int) (id runtimebin.ID, err error) {
	exe := procfs.PIDPath(pid, "exe")
	err = c.readAsCell(func() error {
		path, err := os.Readlink(exe)
		if err != nil {
			return err
		}
		if strings.TrimSuffix(path, deletedSuffix) != c.s.binary {
			return fmt.Errorf("pid %d runs %s: %w", pid, path, errOtherExe)
		}
		id, err = runtimebin.Stat(exe)
		return err
	})
	return id, err
}

// adoptRuntime tells what the adopted master pid executes: the file, from
// /proc, and its version, from the runtime record of its start (the file
// may be gone since).
func (c *slot) adoptRuntime(ctx context.Context, pid int) {
	var b cellBin
	id, err := c.exeID(pid)
	if err == nil {
		b = cellBin{binInfo: binInfo{ID: id}, known: true}
	}
	var ticks uint64
	terr := c.readAsCell(func() (err error) { ticks, err = startTicks(pid); return err })
	if rec, rerr := c.readRuntimeRecord(ctx); rerr == nil && terr == nil && rec.PID == pid && rec.StartTicks == ticks && rec.Binary == id {
		b.Version = rec.Version
	}
	cur := c.s.observeBinary()
	if b.known && cur != nil && cur.ID == id && b.Version == "" {
		b.Version = cur.Version
	}
	c.mu.Lock()
	c.bin = b
	c.mu.Unlock()
	superseded := b.known && cur != nil && cur.ID != id
	switch {
	case err != nil:
		c.log.Info("adopted running cell; the file it runs cannot be told", zap.Int("pid", pid), zap.Error(err))
	case superseded:
		c.log.Warn("adopted running cell: it runs a superseded runtime (its binary was replaced)", zap.Int("pid", pid),
			zap.String("version", orUnknown(b.Version)), zap.String("binary_now", orUnknown(cur.Version)))
		// Its record, for a next agent, keeps the version it was
		// started with.
		c.writeRuntimeRecord(pid, ticks)
	default:
		c.log.Info("adopted running cell", zap.Int("pid", pid), zap.String("version", orUnknown(b.Version)))
	}
}

func orUnknown(v string) string {
	if v == "" {
		return "unknown"
	}
	return v
}

// runtimeStatus is the running master's binary, for status; nil when no
// master runs or its file cannot be told.
func (c *slot) runtimeStatus(cur *binInfo) *CellRuntime {
	c.mu.Lock()
	b, pid := c.bin, c.pid
	c.mu.Unlock()
	if pid == 0 || !b.known {
		return nil
	}
	r := &CellRuntime{Version: b.Version}
	if (cur != nil && cur.ID != b.ID) || b.staleModules != "" {
		r.Superseded = true
		if cur != nil {
			r.Current = cur.Version
		}
	}
	return r
}

// kickRuntime wakes the runtime routine (runtimeLoop) to look at the
// binary again.
func (s *Supervisor) kickRuntime() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// runtimeTarget is what a roll moves the cells onto: the configured
// binary's file and the identities of the watched module files. A refused
// or failed roll is not tried again until it changes, so a module
// replaced again (a fixed package) is tried even though the binary is the
// same file.
type runtimeTarget struct {
	Bin     runtimebin.ID
	Modules string // the module files' identities, in Options.Watch order
}

// targetOf is the runtime now at the configured paths, cur being the
// binary's.
func (s *Supervisor) targetOf(cur *binInfo) runtimeTarget {
	t := runtimeTarget{Bin: cur.ID}
	var b strings.Builder
	for _, m := range s.o.Watch {
		id, err := runtimebin.Stat(m)
		if err != nil {
			fmt.Fprintf(&b, "%s:missing;", m)
			continue
		}
		fmt.Fprintf(&b, "%s:%d:%d:%d:%d;", m, id.Dev, id.Ino, id.Size, id.MTime)
	}
	t.Modules = b.String()
	return t
}

// RuntimeOf is the runtime the cell name's master runs: the version it
// started with ("" unknown) and whether its binary or a module was
// replaced since; ok is false when no master runs or its file cannot be
// told. The acks carry it (activation).
func (s *Supervisor) RuntimeOf(name string) (version string, superseded, ok bool) {
	for _, c := range s.slots {
		if c.spec.Name != name {
			continue
		}
		r := c.runtimeStatus(s.bin.Load())
		if r == nil {
			return "", false, false
		}
		return r.Version, r.Superseded, true
	}
	return "", false, false
}
