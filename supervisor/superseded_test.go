package supervisor_test

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// copyBinary copies the host's OpenResty binary to a fresh temporary
// directory the cells can reach, and returns the copy's path.
func copyBinary(t *testing.T) string {
	t.Helper()
	bin, _ := testutil.RequireOpenResty(t)
	dir := t.TempDir()
	testutil.Traversable(t, dir)
	dst := filepath.Join(dir, filepath.Base(bin))
	installBinary(t, bin, dst)
	return dst
}

// installBinary installs src at dst as a package upgrade does: written
// beside it, then renamed over it (dpkg's .dpkg-new), so running processes
// keep the old file.
func installBinary(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	tmp := dst + ".dpkg-new"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// runtimeOf waits until the slot reports its master's runtime as cond
// wants, and returns the slot.
func (h *harness) runtimeOf(name string, cond func(supervisor.SlotStatus) error) supervisor.SlotStatus {
	h.t.Helper()
	var st supervisor.SlotStatus
	testutil.Eventually(h.t, 30*time.Second, func() error {
		st = h.slot(name)
		if st.Runtime == nil {
			return fmt.Errorf("%s (pid %d) reports no runtime", name, st.PID)
		}
		return cond(st)
	})
	return st
}

// A master whose binary a package upgrade replaced at the same path is
// adopted by a restarted agent (it is the recorded master: same pid, start
// time, command line, cgroup), not killed; status says it runs a
// superseded runtime, with the version it started with and the one the
// path holds now.
func TestAdoptsMasterOfAReplacedBinary(t *testing.T) {
	bin := copyBinary(t)
	// Manual: an automatic roll would replace the masters this test
	// follows (upgrade_test.go tests it).
	h := newHarness(t, harnessOpts{slots: 2, assign: allAssigned(2), binary: bin, upgrade: supervisor.UpgradeManual})
	before := h.waitReady("cell-01", 0)
	two := h.waitReady("cell-02", 0)
	st := h.runtimeOf("cell-01", func(s supervisor.SlotStatus) error {
		if s.Runtime.Version == "" || s.Runtime.Superseded {
			return fmt.Errorf("runtime %+v, want a known version, not superseded", *s.Runtime)
		}
		return nil
	})
	version := st.Runtime.Version

	original, _ := testutil.RequireOpenResty(t)
	installBinary(t, original, bin)
	// The running agent sees it too.
	if st := h.slot("cell-01"); st.Runtime == nil || !st.Runtime.Superseded {
		t.Errorf("after the binary was replaced: runtime %+v, want superseded", st.Runtime)
	}

	h.leaveAndRestart()
	for _, want := range []supervisor.SlotStatus{before, two} {
		got := h.runtimeOf(want.Name, func(s supervisor.SlotStatus) error {
			if !s.Runtime.Superseded || s.Runtime.Current == "" {
				return fmt.Errorf("runtime %+v, want superseded with the binary's version now", *s.Runtime)
			}
			return nil
		})
		if got.State != supervisor.StateReady || got.PID != want.PID {
			t.Errorf("%s: %s pid %d, want the running master %d adopted and ready", got.Name, got.State, got.PID, want.PID)
		}
		if got.Runtime.Version != version || got.Runtime.Current != version {
			t.Errorf("%s: runs %q, binary now %q; want %q both (the same package's copy)", got.Name, got.Runtime.Version, got.Runtime.Current, version)
		}
		exe, err := os.Readlink("/proc/" + strconv.Itoa(got.PID) + "/exe")
		if err != nil || !strings.HasSuffix(exe, " (deleted)") {
			t.Errorf("%s: master's exe %q (%v), want the replaced file", got.Name, exe, err)
		}
		if code, body, err := get(got.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
			t.Errorf("%s after adoption: %d %q %v", got.Name, code, body, err)
		}
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		st := h.sup.Status()
		if r := st.Runtime; r == nil || r.Superseded != 2 || r.Binary != bin || r.Upgrade != supervisor.UpgradeWaiting {
			return fmt.Errorf("agent's runtime %+v, want %s with 2 superseded cells waiting for the operator", r, bin)
		}
		return nil
	})
}
