package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/clock"
)

// A file renamed over the watched binary or module (as a package installs
// one) is told once the directory is quiet again.
func TestWatchRuntimeSeesAFileRenamedOverTheBinary(t *testing.T) {
	dir := t.TempDir()
	bin, mod := filepath.Join(dir, "nginx"), filepath.Join(dir, "mods", "lua.so")
	if err := os.MkdirAll(filepath.Dir(mod), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{bin, mod} {
		if err := os.WriteFile(f, []byte("old"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := &Supervisor{binary: bin, o: Options{Watch: []string{mod}}, clk: clock.Or(nil), log: zap.NewNop()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	changed, stop := s.watchRuntime(ctx)
	defer stop()
	for _, f := range []string{bin, mod} {
		if err := os.WriteFile(f+".dpkg-new", []byte("new"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f+".dpkg-new", f); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("%s replaced: no change told", f)
		}
	}
}
