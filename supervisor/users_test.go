package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"cellvisor/domain"
	"cellvisor/internal/celluser"
	"cellvisor/internal/testcert"
	"cellvisor/supervisor"
	"cellvisor/testkit/testutil"
)

// procUIDAndCaps reads a process's real and effective uid and its
// permitted and effective capabilities.
func procUIDAndCaps(t *testing.T, pid int) (uids string, capPrm, capEff string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		f := strings.Fields(v)
		switch {
		case k == "Uid" && len(f) >= 2:
			uids = f[0] + " " + f[1]
		case k == "CapPrm" && len(f) == 1:
			capPrm = strings.TrimLeft(f[0], "0")
		case k == "CapEff" && len(f) == 1:
			capEff = strings.TrimLeft(f[0], "0")
		}
	}
	return uids, capPrm, capEff
}

// Cells of slots with users of their own run as those users, master and
// workers, with no capabilities; each reads its own secret and not its
// neighbour's; the agent still reaches each cell's private endpoint
// (drain), and a restarted agent adopts them.
func TestCellsRunAsTheirSlotsUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running cells as other users needs root (or the packaged unit's capabilities)")
	}
	users := map[string]*celluser.User{
		"cell-01": {Name: "cellvisor-cell-01", UID: 64301, GID: 64301},
		"cell-02": {Name: "cellvisor-cell-02", UID: 64302, GID: 64302},
	}
	// Domains with certificates too: each cell's keys are its own.
	ds, keys := tlsDomains(t, testcert.NewCA(t), 1)
	ds = append(ds, domain.Domain{Domain: testHost, Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{testHost},
		Routes: []domain.Route{{Prefix: "/", Respond: &domain.Response{Status: 200, Body: "hello"}}}})
	h := newHarness(t, harnessOpts{slots: 2, assign: allAssigned(2), users: users, domains: ds, keys: keys})
	if st := h.sup.Status(); st.CellUsers != "slot" {
		t.Errorf("status cell_users %q, want slot", st.CellUsers)
	}
	for name, u := range users {
		st := h.waitReady(name, 0)
		pids, err := h.cg.Ensure(name, h.opts.Limits)
		if err != nil {
			t.Fatal(err)
		}
		members, err := pids.Procs()
		if err != nil || len(members) < 2 {
			t.Fatalf("%s: members %v, %v: want a master and a worker", name, members, err)
		}
		want := fmt.Sprintf("%d %d", u.UID, u.UID)
		for _, pid := range members {
			if cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); strings.Contains(string(cmd), "cellvisor-standby") {
				continue // the slot's spare, not started yet (the shell helper switches at its exec)
			}
			uids, prm, eff := procUIDAndCaps(t, pid)
			if uids != want || prm != "" || eff != "" {
				t.Errorf("%s: pid %d runs as uid %q with capabilities %q/%q; want %q and none", name, pid, uids, prm, eff, want)
			}
		}
		if code, body, err := get(st.HTTPPort, "/"); err != nil || code != 200 || body != "hello" {
			t.Errorf("%s: %d %q %v", name, code, body, err)
		}
	}
	one, two := h.slotSpec("cell-01"), h.slotSpec("cell-02")
	read := func(u *celluser.User, path string) error {
		return celluser.Do(u, func() error { _, err := os.ReadFile(path); return err })
	}
	ownKeys, otherKeys := filepath.Join(one.RuntimeDir(), "current", "tls", "keys.json"), filepath.Join(two.RuntimeDir(), "current", "tls", "keys.json")
	for _, path := range []string{one.SecretFile(), ownKeys} {
		if err := read(users["cell-01"], path); err != nil {
			t.Errorf("cell-01's user reading its own %s: %v", path, err)
		}
	}
	if data, err := os.ReadFile(otherKeys); err != nil || !strings.Contains(string(data), "PRIVATE KEY") {
		t.Fatalf("cell-02's keys file: %v (want the keys in it, for the check below to mean something)", err)
	}
	for _, path := range []string{two.SecretFile(), otherKeys, filepath.Join(two.RunDir, "master.json"), filepath.Join(one.RunDir, "master.json")} {
		if err := read(users["cell-01"], path); !errors.Is(err, os.ErrPermission) {
			t.Errorf("cell-01's user reading %s: %v, want permission denied", path, err)
		}
	}
	if st, err := h.sup.Drain(context.Background(), "cell-01"); err != nil || st.State != supervisor.StateDrained {
		t.Fatalf("drain through the private endpoint: %s, %v", st.State, err)
	}
	before := h.slot("cell-02")
	h.leaveAndRestart()
	if got := h.waitReady("cell-02", 0); got.PID != before.PID {
		t.Errorf("cell-02 after an agent restart: pid %d, want %d adopted", got.PID, before.PID)
	}
}

// A running cell of another user than the slot's (cell_users changed
// across an agent restart) is not adopted: it is replaced by one of the
// slot's user.
func TestCellOfAnotherUserIsNotAdopted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running cells as other users needs root")
	}
	h := newHarness(t, harnessOpts{slots: 1, assign: allAssigned(1)})
	before := h.waitReady("cell-01", 0)
	u := &celluser.User{Name: "cellvisor-cell-01", UID: 64311, GID: 64311}
	testutil.Traversable(t, filepath.Dir(h.cfg.StateDir))
	if err := h.topo.Own(h.cfg.StateDir, h.cfg.RunDir, map[string]int{"cell-01": int(u.GID)}); err != nil {
		t.Fatal(err)
	}
	h.opts.Users = map[string]*celluser.User{"cell-01": u}
	h.leaveAndRestart()
	after := h.waitReady("cell-01", before.PID)
	if uids, _, _ := procUIDAndCaps(t, after.PID); uids != "64311 64311" {
		t.Errorf("the new master runs as %q, want the slot's user 64311", uids)
	}
}
