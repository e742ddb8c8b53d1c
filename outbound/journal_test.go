package outbound

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/edgeapi"
)

func newTestBundle(t *testing.T, items any) edgeapi.Bundle {
	t.Helper()
	b, err := NewBundle(org, "edge-a", "metering", time.Now(), items)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestJournalBoundRefusesAndCounts(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(context.Background(), dir, 2, edgeapi.MaxBundleBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, second := newTestBundle(t, 1), newTestBundle(t, 2)
	for _, b := range []edgeapi.Bundle{first, second, second} { // the same bundle again is taken, not counted
		if err := j.Put(b); err != nil {
			t.Fatal(err)
		}
	}
	third := newTestBundle(t, 3)
	if err := j.Put(third); !errors.Is(err, ErrJournalFull) {
		t.Fatalf("put at the count bound: %v, want ErrJournalFull", err)
	}
	st := j.Status()
	if st.Bundles != 2 || st.Refused != 1 || !strings.Contains(st.LastError, third.ID) {
		t.Fatalf("status %+v: want 2 bundles, 1 refused naming %s", st, third.ID)
	}
	if _, err := os.Stat(filepath.Join(dir, third.ID+".json")); !os.IsNotExist(err) {
		t.Fatalf("the refused bundle was written: %v", err)
	}
	// The journaled ones stay; once one is delivered there is room again.
	if err := j.Remove(first.ID); err != nil {
		t.Fatal(err)
	}
	if err := j.Put(third); err != nil {
		t.Fatalf("put after a delivery: %v", err)
	}

	// The byte bound: a bundle that does not fit is refused too.
	j2, err := OpenJournal(context.Background(), t.TempDir(), 100, edgeapi.MaxBundleBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := newTestBundle(t, strings.Repeat("x", edgeapi.MaxBundleBytes/2))
	if err := j2.Put(big); err != nil {
		t.Fatal(err)
	}
	if err := j2.Put(newTestBundle(t, strings.Repeat("y", edgeapi.MaxBundleBytes/2))); !errors.Is(err, ErrJournalFull) {
		t.Fatalf("put over the byte bound: %v, want ErrJournalFull", err)
	}
}

func TestJournalSetsAsideWhatItCannotRead(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(context.Background(), dir, 10, edgeapi.MaxBundleBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	good := newTestBundle(t, 1)
	if err := j.Put(good); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "elsewhere.json")
	os.WriteFile(target, []byte(`{}`), 0o600)
	bad := map[string]func(string) error{
		"0123456789abcdef0123456789abcdef.json": func(p string) error { return os.Symlink(target, p) },
		"11111111111111111111111111111111.json": func(p string) error { return syscall.Mkfifo(p, 0o600) },
		"22222222222222222222222222222222.json": func(p string) error { return os.WriteFile(p, []byte("{not json"), 0o600) },
		"33333333333333333333333333333333.json": func(p string) error {
			return os.WriteFile(p, make([]byte, edgeapi.MaxBundleBytes+1), 0o600)
		},
		// A valid bundle under another bundle's name.
		"44444444444444444444444444444444.json": func(p string) error {
			data, _ := os.ReadFile(filepath.Join(dir, good.ID+".json"))
			return os.WriteFile(p, data, 0o600)
		},
	}
	for name, mk := range bad {
		if err := mk(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j2, err := OpenJournal(ctx, dir, 10, edgeapi.MaxBundleBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := j2.Status()
	if st.Bundles != 1 || st.Damaged != len(bad) {
		t.Fatalf("status %+v: want the 1 good bundle and %d set aside", st, len(bad))
	}
	if p := j2.Pending("metering"); len(p) != 1 || p[0].ID != good.ID {
		t.Fatalf("pending %+v, want %s", p, good.ID)
	}
	for name := range bad {
		if _, err := os.Lstat(filepath.Join(dir, name+".bad")); err != nil {
			t.Errorf("%s not set aside: %v", name, err)
		}
	}
}

func TestRouteFrom(t *testing.T) {
	exp := time.Now().Add(time.Minute)
	holder := func(id string, epoch int64) *edgeapi.Holder {
		return &edgeapi.Holder{EdgeID: id, IntakeURL: "https://127.0.0.1:1", Epoch: epoch, ExpiresAt: exp}
	}
	cases := []struct {
		name  string
		resp  edgeapi.ElectResponse
		mode  string
		epoch int64
	}{
		{"elected", edgeapi.ElectResponse{Outcome: edgeapi.OutcomeElected, Holder: holder("me", 7)}, edgeapi.RouteDirect, 7},
		{"alone and elected", edgeapi.ElectResponse{Outcome: edgeapi.OutcomeElected, Alone: true, Holder: holder("me", 3)}, edgeapi.RouteDirect, 3},
		{"alone without a lease sends as a fallback", edgeapi.ElectResponse{Outcome: edgeapi.OutcomeElected, Alone: true}, edgeapi.RouteDirect, 0},
		{"deferred to a holder", edgeapi.ElectResponse{Outcome: edgeapi.OutcomeDeferred, Holder: holder("peer", 4)}, edgeapi.RouteProxy, 4},
		{"deferred, nobody holds yet", edgeapi.ElectResponse{Outcome: edgeapi.OutcomeDeferred, Stage: edgeapi.StageRanking}, edgeapi.RouteUnknown, 0},
		{"refused", edgeapi.ElectResponse{Outcome: edgeapi.OutcomeRefused, Stage: edgeapi.StageNoBlackHole, Reason: "no reach"}, edgeapi.RouteRefused, 0},
		{"refused though a holder is named", edgeapi.ElectResponse{Outcome: edgeapi.OutcomeRefused, Holder: holder("me", 2)}, edgeapi.RouteRefused, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := routeFrom(tc.resp, "me", time.Now())
			if r.mode != tc.mode || r.epoch != tc.epoch {
				t.Fatalf("route %s epoch %d, want %s epoch %d", r.mode, r.epoch, tc.mode, tc.epoch)
			}
			if r.holds() != (tc.mode == edgeapi.RouteDirect && tc.epoch > 0) {
				t.Fatalf("holds() = %v", r.holds())
			}
		})
	}
}

func TestIsBundleID(t *testing.T) {
	for id, want := range map[string]bool{
		"0123456789abcdef0123456789abcdef":  true,
		"0123456789ABCDEF0123456789abcdef":  false, // uppercase
		"0123456789abcdef0123456789abcde":   false, // 31
		"0123456789abcdef0123456789abcdef0": false, // 33
		"0123456789abcdeg0123456789abcdef":  false,
		"0123456789abcdef/123456789abcdef":  false,
		"0123456789abcdef`123456789abcdef":  false,
		"":                                  false,
	} {
		if got := isBundleID(id); got != want {
			t.Errorf("isBundleID(%q) = %v, want %v", id, got, want)
		}
	}
}
