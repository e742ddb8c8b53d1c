package snapcache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/zap"

	"cellvisor/testkit/testutil"
)

// The snapshot files: one build per edge and sequence however many
// download it, a newer sequence replaces the older, a failed build is not
// kept, and past maxFiles the least recently used idle one is closed.
func TestSnapshotFilesAreBuiltOnceAndEvicted(t *testing.T) {
	ss, err := New(Options{Dir: t.TempDir(), Downloads: 2, PerEdge: 1, PerOrg: 1, MinRate: 256 << 10, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	builds := map[string]int{}
	build := func(edge string, seq int64) func(*os.File) (int64, error) {
		return func(f *os.File) (int64, error) {
			builds[fmt.Sprintf("%s/%d", edge, seq)]++ // builds run one at a time here
			n, err := f.WriteString(fmt.Sprintf("%s at %d", edge, seq))
			return int64(n), err
		}
	}
	get := func(edge string, seq int64) *File {
		t.Helper()
		sf, err := ss.Acquire(ctx, edge, seq, build(edge, seq))
		if err != nil {
			t.Fatal(err)
		}
		return sf
	}
	a1 := get("a", 1)
	a1again := get("a", 1)
	if a1 != a1again || builds["a/1"] != 1 {
		t.Fatalf("a second download built again: %d builds", builds["a/1"])
	}
	ss.Release(a1again)
	a2 := get("a", 2)
	if builds["a/2"] != 1 || a2 == a1 {
		t.Fatal("a newer sequence was not built")
	}
	// a1 is still being read: its file stays open until released.
	buf := make([]byte, 4)
	if _, err := a1.f.ReadAt(buf, 0); err != nil {
		t.Fatalf("a file in use was closed: %v", err)
	}
	ss.Release(a1)
	waitClosed(t, a1)
	ss.Release(a2)

	// A failed build is answered, and retried by the next download.
	fail := errors.New("store down")
	if _, err := ss.Acquire(ctx, "b", 1, func(*os.File) (int64, error) { return 0, fail }); !errors.Is(err, fail) {
		t.Fatalf("failed build: %v", err)
	}
	ss.Release(get("b", 1))
	if builds["b/1"] != 1 {
		t.Fatal("a failed build was kept")
	}

	// Past maxFiles (4 here), the least recently used idle file is evicted.
	var all []*File
	for i := range 6 {
		sf := get(fmt.Sprintf("e%d", i), 1)
		all = append(all, sf)
		ss.Release(sf)
	}
	ss.mu.Lock()
	kept := len(ss.files)
	ss.mu.Unlock()
	if kept > ss.maxFiles() {
		t.Errorf("%d files kept, at most %d", kept, ss.maxFiles())
	}
	waitClosed(t, all[0])
	ss.Close()
	waitClosed(t, all[5])
}

func waitClosed(t *testing.T, sf *File) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, func() error {
		if _, err := sf.f.ReadAt(make([]byte, 1), 0); !errors.Is(err, os.ErrClosed) {
			return fmt.Errorf("snapshot file of %s at %d not closed: %v", sf.edge, sf.seq, err)
		}
		return nil
	})
}
