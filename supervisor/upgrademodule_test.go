package supervisor_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// moduleSignature is nginx's module signature, as a dynamic module carries
// it (NGX_MODULE_SIGNATURE: "8,4,8,0011..."): nginx refuses to load a
// module whose signature differs from its own.
var moduleSignature = regexp.MustCompile(`[0-9]+,[0-9]+,[0-9]+,[01]{16,}`)

// installIncompatible installs over dst, as a package would, a copy of the
// real module src whose signature is another build's: a module built for
// another nginx, which the binary refuses to load.
func installIncompatible(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	loc := moduleSignature.FindIndex(data)
	if loc == nil {
		t.Skipf("no nginx module signature found in %s", src)
	}
	i := loc[1] - 1 // the signature's last flag, flipped
	data = bytes.Clone(data)
	data[i] = '0' + '1' - data[i]
	tmp := filepath.Join(filepath.Dir(dst), filepath.Base(dst)+".dpkg-new")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// hostModules installs copies of the host's module files into dir, as a
// package would, and returns the host's and the copies' paths; it skips
// where the host's OpenResty has its Lua built in.
func hostModules(t *testing.T, dir string) (mods, copies []string) {
	t.Helper()
	_, mods = testutil.RequireOpenResty(t)
	if len(mods) == 0 {
		t.Skip("the host's OpenResty has its Lua built in: no module file to replace")
	}
	testutil.Traversable(t, dir)
	for _, m := range mods {
		dst := filepath.Join(dir, filepath.Base(m))
		installBinary(t, m, dst)
		copies = append(copies, dst)
	}
	return mods, copies
}

// An incompatible module file (built for another nginx) installed while the
// cells serve is refused before any cell is touched: every cell keeps its
// master, serves, and status says why. The fixed module, installed next,
// is tried though the binary is the same file, and the cells are rolled.
func TestIncompatibleModuleTouchesNoCell(t *testing.T) {
	mods, copies := hostModules(t, t.TempDir())
	h := newHarness(t, harnessOpts{slots: 2, assign: allAssigned(2), modules: copies})
	before := []supervisor.SlotStatus{h.waitReady("cell-01", 0), h.waitReady("cell-02", 0)}
	lua := copies[len(copies)-1]
	installIncompatible(t, mods[len(mods)-1], lua)
	h.sup.CheckRuntime()
	var st supervisor.Status
	testutil.Eventually(t, 30*time.Second, func() error {
		st = h.sup.Status()
		if st.Runtime.Upgrade != supervisor.UpgradeRefused {
			return fmt.Errorf("runtime %+v, want the module refused", *st.Runtime)
		}
		return nil
	})
	if r := st.Runtime; !strings.Contains(r.Reason, "is not binary compatible") || r.Superseded != 2 {
		t.Errorf("runtime %+v, want nginx's refusal of the module as the reason, 2 cells on the old one", *r)
	}
	for _, want := range before {
		got := h.slot(want.Name)
		if got.PID != want.PID || got.State != supervisor.StateReady || got.Restarts != 0 {
			t.Errorf("%s: %s pid %d restarts %d, want the old master %d untouched", got.Name, got.State, got.PID, got.Restarts, want.PID)
		}
		if code, body, err := get(got.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
			t.Errorf("%s: %d %q %v, want it serving", got.Name, code, body, err)
		}
	}

	// The fixed module: a new file, so tried again, and rolled.
	installBinary(t, mods[len(mods)-1], lua)
	h.sup.CheckRuntime()
	testutil.Eventually(t, 60*time.Second, func() error {
		st := h.sup.Status()
		if st.Runtime.Superseded != 0 || st.Runtime.Upgrade != supervisor.UpgradeIdle {
			return fmt.Errorf("runtime %+v, want every cell rolled onto the fixed module", *st.Runtime)
		}
		for i, s := range st.Slots {
			if s.State != supervisor.StateReady || s.PID == before[i].PID {
				return fmt.Errorf("%s: %s pid %d, want a new master ready", s.Name, s.State, s.PID)
			}
		}
		return nil
	})
}

// Modules configured through a linked directory (Debian's
// /usr/share/nginx/modules links to /usr/lib/nginx/modules, where the
// package installs them, and where /proc/PID/maps names them): a module
// replaced there still makes the masters superseded, and they are rolled.
func TestRollsCellsOntoAModuleInALinkedDirectory(t *testing.T) {
	dir := t.TempDir()
	testutil.Traversable(t, dir)
	real := filepath.Join(dir, "lib")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "share")
	if err := os.Symlink("lib", link); err != nil {
		t.Fatal(err)
	}
	mods, copies := hostModules(t, real)
	var configured []string
	for _, c := range copies {
		configured = append(configured, filepath.Join(link, filepath.Base(c)))
	}
	h := newHarness(t, harnessOpts{slots: 1, assign: allAssigned(1), modules: configured})
	before := h.waitReady("cell-01", 0)
	installBinary(t, mods[len(mods)-1], filepath.Join(real, filepath.Base(mods[len(mods)-1])))
	testutil.Eventually(t, 30*time.Second, func() error {
		if s := h.slot("cell-01"); s.State != supervisor.StateReady || s.PID == before.PID || s.Runtime == nil || s.Runtime.Superseded {
			return fmt.Errorf("cell-01: %s pid %d (was %d) runtime %+v, want a new master on the new module", s.State, s.PID, before.PID, s.Runtime)
		}
		return nil
	})
}
