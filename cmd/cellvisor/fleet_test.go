package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/fleet"
	"cellvisor/testkit/testutil"
)

// browser starts a headless Chromium for the test, or skips it saying why.
// It is stopped, and reaped, when the test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("skipped: no chromium on PATH (make deps installs Debian's chromium)")
	}
	dataDir := t.TempDir()
	// Chromium makes its singleton socket's directory in TMPDIR, and a
	// killed browser leaves it there: in the test's own, it goes with it.
	tmp := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.Env("TMPDIR=" + tmp),
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(dataDir),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	allocCtx, allocCancel := chromedp.NewExecAllocator(ctx, opts...)
	bctx, bcancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		bcancel()
		allocCancel() // kills the browser and waits for it
		cancel()
		// Its children (zygote, renderers, network service) outlive it
		// briefly; each carries the test's own data directory.
		testutil.Eventually(t, 10*time.Second, func() error {
			if pids := processesWith("--user-data-dir=" + dataDir); len(pids) > 0 {
				for _, pid := range pids {
					syscall.Kill(pid, syscall.SIGKILL)
				}
				return fmt.Errorf("chromium processes %v still running", pids)
			}
			return nil
		})
	})
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// processesWith returns the processes with arg on their command line.
func processesWith(arg string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(cmdline), "\x00"), arg) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// attr reads one attribute of the first node matching sel.
func attr(ctx context.Context, sel, name string) (string, error) {
	v, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(sel), name))
	if err == nil && !v.Exists {
		err = fmt.Errorf("%s has no %s", sel, name)
	}
	return v.Value, err
}

// text reads the text of the first node matching sel.
func text(ctx context.Context, sel string) (string, error) {
	v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	return strings.TrimSpace(v), err
}

// location is the page's address.
func location(t *testing.T, ctx context.Context) string {
	t.Helper()
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// An operator signs in to the fleet page in a real browser and sees a
// real enrolled edge with its real cells and their states; after a drain
// task, the drained cell shows drained.
func TestFleetPageInChromium(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	c := startControl(t, t.TempDir(), "127.0.0.1:0")
	cfgPath, cfg := agentConfig(t, 3, "source:\n  poll_interval: 100ms\n  max_backoff: 400ms\n  status_interval: 200ms\n")
	bctx := browser(t)
	created := c.enroll(t, bin, cfgPath, adminapi.EdgeRequest{Name: "fleet-edge", Org: "acme", Country: "NL", Continent: "EU", Slots: 3})
	id := created.Edge.ID
	c.publish(t, "v1")
	startAgent(t, bin, cfgPath, cfg)
	c.awaitEdge(t, id, "sequence 2 applied and 3 cells reported", func(v adminapi.EdgeView) bool { return v.ActiveSequence == 2 && len(v.Cells) == 3 })

	// Signed out, the page sends the browser to the sign-in form.
	fleetURL := c.ep.AdminURL + fleet.Path
	if err := chromedp.Do(bctx, chromedp.Navigate(fleetURL), chromedp.WaitVisible(chromedp.ID("token"))); err != nil {
		t.Fatal(err)
	}
	if loc := location(t, bctx); loc != c.ep.AdminURL+fleet.Login {
		t.Fatalf("signed out, the fleet page is at %s", loc)
	}
	// A wrong token is refused on the form.
	if err := chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token"), "not-the-admin-token"), chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.CSS(".error"))); err != nil {
		t.Fatal(err)
	}
	if msg, err := text(bctx, ".error"); err != nil || msg != "admin token rejected" {
		t.Fatalf("wrong token: %q (%v)", msg, err)
	}
	if err := chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token"), c.ep.AdminToken), chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-edge="fleet-edge"]`))); err != nil {
		t.Fatal(err)
	}
	if loc := location(t, bctx); loc != fleetURL {
		t.Fatalf("signed in at %s", loc)
	}
	row := `tr[data-edge="fleet-edge"]`
	for cell, want := range map[string]string{"cell-01": "ready", "cell-02": "ready"} {
		got, err := attr(bctx, row+` [data-cell="`+cell+`"]`, "data-state")
		if err != nil || got != want {
			t.Fatalf("fleet page: %s is %q (%v), want %s", cell, got, err, want)
		}
	}
	// The edge's first manifest (empty, at its creation) and the publish.
	if got, err := text(bctx, row+" .seq"); err != nil || got != "2 / 2" {
		t.Fatalf("fleet page sequence %q (%v)", got, err)
	}
	if cls, err := attr(bctx, row, "class"); err != nil || strings.Contains(cls, "silent") {
		t.Fatalf("a polling edge is marked silent: %q (%v)", cls, err)
	}

	// The edge's own page: every slot, cell-03 unassigned and stopped.
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(row+" a")), chromedp.WaitVisible(chromedp.ID("cells"))); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]string{"cell-01": {"ready", "ready"}, "cell-02": {"ready", "ready"}, "cell-03": {"stopped", "not ready"}}
	for cell, w := range want {
		sel := `#cells tr[data-cell="` + cell + `"]`
		if got, err := attr(bctx, sel, "data-state"); err != nil || got != w[0] {
			t.Fatalf("edge page: %s is %q (%v), want %s", cell, got, err, w[0])
		}
		if got, err := text(bctx, sel+" .readiness"); err != nil || got != w[1] {
			t.Fatalf("edge page: %s readiness %q (%v), want %s", cell, got, err, w[1])
		}
	}

	// A drain task drains cell-01; the page shows it drained, and the task
	// done.
	task, err := c.admin.CreateTask(ctxT(t), id, adminapi.TaskRequest{Cell: "cell-01", Action: "drain"})
	if err != nil {
		t.Fatal(err)
	}
	// Drained is set at once; the state follows once the slot's routine has
	// seen it: the page is checked after the control API holds both.
	c.awaitEdge(t, id, "cell-01 reported drained", func(v adminapi.EdgeView) bool {
		return len(v.Cells) == 3 && v.Cells[0].Drained && v.Cells[0].State == "drained" && len(v.Tasks) == 1 && v.Tasks[0].State == "done"
	})
	if err := chromedp.Do(bctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("tasks"))); err != nil {
		t.Fatal(err)
	}
	sel := `#cells tr[data-cell="cell-01"]`
	if got, err := attr(bctx, sel, "data-state"); err != nil || got != "drained" {
		t.Fatalf("after the drain task, cell-01 is %q (%v)", got, err)
	}
	if got, err := text(bctx, sel+" .readiness"); err != nil || got != "drained" {
		t.Fatalf("after the drain task, cell-01 readiness %q (%v)", got, err)
	}
	if got, err := text(bctx, fmt.Sprintf(`#tasks tr[data-task="%d"] .task-state`, task.ID)); err != nil || got != "done" {
		t.Fatalf("drain task %d: %q (%v)", task.ID, got, err)
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(fleetURL), chromedp.WaitVisible(chromedp.CSS(row))); err != nil {
		t.Fatal(err)
	}
	if got, err := attr(bctx, row+` [data-cell="cell-01"]`, "class"); err != nil || !strings.Contains(got, "state-drained") {
		t.Fatalf("fleet page: cell-01 class %q (%v), want state-drained", got, err)
	}
}
