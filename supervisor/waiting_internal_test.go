package supervisor

import (
	"os"
	"path/filepath"
	"testing"

	"cellvisor/runtime"
)

// A slot waits for its first release only when it never had one: a
// release withdrawn as damaged leaves its directory, and that slot is
// degraded.
func TestNeverReleased(t *testing.T) {
	s := runtime.Slot{Name: "cell-01", Dir: t.TempDir()}
	if !neverReleased(s) {
		t.Error("a slot with no runtime directory has had a release")
	}
	if err := os.MkdirAll(filepath.Join(s.RuntimeDir(), "releases"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !neverReleased(s) {
		t.Error("a slot with an empty releases directory has had a release")
	}
	if err := os.Mkdir(filepath.Join(s.RuntimeDir(), "releases", "000000000001-abc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if neverReleased(s) {
		t.Error("a slot with a (withdrawn) release directory never had a release")
	}
}
