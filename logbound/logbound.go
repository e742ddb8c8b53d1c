// Package logbound keeps a cell's logs directory under a byte budget: it
// watches the directory with fsnotify, rotates a live log (rename to .1, the
// older generation dropped) once it reaches a quarter of the budget and asks
// the writer to reopen its files, and deletes rotated generations while the
// directory is over budget. Only supervisor and agent import it (agent
// for the directories' sizes).
package logbound

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// Options configures a Bound.
type Options struct {
	// Dir is the logs directory. Required.
	Dir string
	// Budget is the most bytes the directory may hold. Required.
	Budget int64
	// Reopen asks the writer to reopen its log files (SIGUSR1 to nginx), or
	// nil for a writer that reopens by itself.
	Reopen func() error
	// Logger, or nil for none.
	Logger *zap.Logger
}

// Bound enforces the budget of one directory.
type Bound struct {
	o   Options
	log *zap.Logger
}

// New validates options.
func New(o Options) (*Bound, error) {
	if o.Dir == "" || o.Budget <= 0 {
		return nil, errors.New("logbound: Dir and a positive Budget are required")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return &Bound{o: o, log: o.Logger.Named("logbound")}, nil
}

// minInterval spaces budget checks under a stream of writes. At 16 MiB a
// cell would have to log over 40 MiB/s to outrun a quarter-budget rotation.
const minInterval = 100 * time.Millisecond

// rotateAt is the size at which a live log is rotated: a quarter of the
// budget, so that live and rotated generations of a few files, plus what is
// written while the writer reopens, stay within it.
func (b *Bound) rotateAt() int64 { return b.o.Budget / 4 }

// Run watches the directory until ctx ends, enforcing the budget after every
// write (coalesced) and at least once a second.
func (b *Bound) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", b.o.Dir, err)
	}
	defer w.Close()
	if err := w.Add(b.o.Dir); err != nil {
		return fmt.Errorf("watch %s: %w", b.o.Dir, err)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if err := b.Enforce(); err != nil {
			b.log.Warn("enforce log budget", zap.String("dir", b.o.Dir), zap.Error(err))
		}
		// At most one check per minInterval: access logs are written on every
		// request, and the agent has a quarter of a CPU for all its cells.
		pause := time.NewTimer(minInterval)
		select {
		case <-ctx.Done():
			pause.Stop()
			return nil
		case <-pause.C:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case err := <-w.Errors:
			b.log.Warn("log watch", zap.Error(err))
		case <-w.Events:
		}
		drain(w.Events) // one pass covers every event that queued meanwhile
	}
}

func drain(ch <-chan fsnotify.Event) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

type file struct {
	name string
	size int64
	mod  time.Time
}

// Enforce checks the directory once: rotates live logs at the threshold and
// deletes rotated generations, oldest first, while over budget.
func (b *Bound) Enforce() error {
	files, err := list(b.o.Dir)
	if err != nil {
		return err
	}
	rotated := false
	for _, f := range files {
		if isRotated(f.name) || f.size < b.rotateAt() {
			continue
		}
		live := filepath.Join(b.o.Dir, f.name)
		if err := os.Rename(live, live+".1"); err != nil {
			return fmt.Errorf("rotate %s: %w", f.name, err)
		}
		rotated = true
		b.log.Debug("rotated", zap.String("file", live), zap.Int64("bytes", f.size))
	}
	if rotated && b.o.Reopen != nil {
		if err := b.o.Reopen(); err != nil {
			return fmt.Errorf("reopen logs: %w", err)
		}
	}
	if files, err = list(b.o.Dir); err != nil {
		return err
	}
	var total int64
	for _, f := range files {
		total += f.size
	}
	// Oldest rotated generations go first; live files are never deleted.
	sort.Slice(files, func(i, j int) bool { return files[i].mod.Before(files[j].mod) })
	for _, f := range files {
		if total <= b.o.Budget {
			break
		}
		if !isRotated(f.name) {
			continue
		}
		if err := os.Remove(filepath.Join(b.o.Dir, f.name)); err != nil && !os.IsNotExist(err) {
			return err
		}
		total -= f.size
	}
	return nil
}

func isRotated(name string) bool { return strings.HasSuffix(name, ".1") }

func list(dir string) ([]file, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []file
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, file{name: e.Name(), size: info.Size(), mod: info.ModTime()})
	}
	return out, nil
}

// Size returns the bytes in the directory's regular files.
func Size(dir string) (int64, error) {
	files, err := list(dir)
	var total int64
	for _, f := range files {
		total += f.size
	}
	return total, err
}
