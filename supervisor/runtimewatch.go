package supervisor

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// quietAfterChange is how long the watched files must stay unchanged after
// a change before the runtime routine looks: a package upgrade unpacks the
// binary and its modules one after the other.
const quietAfterChange = time.Second

// watchRuntime watches the directories of the configured binary and of
// Options.Watch (a package renames a new file over the old one: the
// directory sees it) and sends on changed once a watched file changed and
// then stayed quiet for quietAfterChange. Without a watch (fsnotify
// refused) the agent still looks at start, on SIGHUP and at every status.
// stop ends the watch and waits for it.
func (s *Supervisor) watchRuntime(ctx context.Context) (changed <-chan struct{}, stop func()) {
	out := make(chan struct{}, 1)
	files := append([]string{s.binary}, s.o.Watch...)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		s.log.Warn("watch the cells' binary: looked at on SIGHUP and status only", zap.Error(err))
		return out, func() {}
	}
	var dirs []string
	for _, f := range files {
		if d := filepath.Dir(f); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
			if err := w.Add(d); err != nil {
				s.log.Warn("watch the cells' binary", zap.String("dir", d), zap.Error(err))
			}
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		var quiet <-chan time.Time
		var t interface{ Stop() bool }
		for {
			select {
			case <-wctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if !slices.Contains(files, ev.Name) {
					continue
				}
				if t != nil {
					t.Stop()
				}
				tm := s.clk.NewTimer(quietAfterChange)
				t, quiet = tm, tm.C()
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				s.log.Warn("watch the cells' binary", zap.Error(err))
			case <-quiet:
				quiet, t = nil, nil
				s.log.Info("the cells' binary or a module changed on disk")
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	})
	return out, func() {
		cancel()
		w.Close()
		wg.Wait()
	}
}
