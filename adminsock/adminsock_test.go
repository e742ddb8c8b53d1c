package adminsock

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"cellvisor/supervisor"
)

// fakeController answers as the agent would: cell-01 exists, cell-02 is
// stopped, a restart is rate limited, and anything else fails.
type fakeController struct {
	shutdowns int
	dryRun    []bool
}

func (f *fakeController) LiveStatus(context.Context) supervisor.Status {
	return supervisor.Status{Slots: []supervisor.SlotStatus{{Name: "cell-01", PID: 42}}}
}

func (f *fakeController) control(verb, cell string) (supervisor.SlotStatus, error) {
	switch {
	case cell == "cell-02":
		return supervisor.SlotStatus{}, fmt.Errorf("%s %s: %w", verb, cell, supervisor.ErrNotRunning)
	case cell == "cell-03":
		return supervisor.SlotStatus{}, errors.New("disk on fire")
	case cell != "cell-01":
		return supervisor.SlotStatus{}, fmt.Errorf("%s %s: %w", verb, cell, supervisor.ErrNoSlot)
	case verb == "restart":
		return supervisor.SlotStatus{}, fmt.Errorf("%s %s: %w", verb, cell, supervisor.ErrRateLimited)
	}
	return supervisor.SlotStatus{Name: cell, PID: 42}, nil
}

func (f *fakeController) Drain(_ context.Context, cell string) (supervisor.SlotStatus, error) {
	return f.control("drain", cell)
}

func (f *fakeController) Undrain(_ context.Context, cell string) (supervisor.SlotStatus, error) {
	return f.control("undrain", cell)
}

func (f *fakeController) Restart(_ context.Context, cell string) (supervisor.SlotStatus, error) {
	return f.control("restart", cell)
}

func (f *fakeController) Shutdown(context.Context) error { f.shutdowns++; return nil }

func (f *fakeController) UpgradeRuntime(_ context.Context, dryRun bool) (supervisor.UpgradePlan, error) {
	f.dryRun = append(f.dryRun, dryRun)
	return supervisor.UpgradePlan{}, nil
}

// serveFake serves ctl on a socket in a temporary directory until the test ends.
func serveFake(t *testing.T, ctl Controller) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.sock")
	srv, err := Listen(path, ctl, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the socket outlives Serve: %v", err)
		}
	})
	return path
}

// TestAdminSocket: the client reaches each control, and the supervisor's
// control errors come back as the agent's answers with their statuses.
func TestAdminSocket(t *testing.T) {
	ctl := &fakeController{}
	path := serveFake(t, ctl)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	ctx := context.Background()
	c := NewClient(path)

	st, err := FetchStatus(ctx, path)
	if err != nil || len(st.Slots) != 1 || st.Slots[0].Name != "cell-01" {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if s, err := c.Control(ctx, "drain", "cell-01"); err != nil || s.Name != "cell-01" || s.PID != 42 {
		t.Errorf("drain cell-01: %+v, %v", s, err)
	}
	for _, tc := range []struct {
		verb, cell string
		status     int
		msg        string
	}{
		{"undrain", "cell-09", http.StatusNotFound, "no such cell"},
		{"drain", "cell-02", http.StatusConflict, "cell is not running"},
		{"restart", "cell-01", http.StatusTooManyRequests, "rate limit"},
		{"drain", "cell-03", http.StatusInternalServerError, "disk on fire"},
	} {
		_, err := c.Control(ctx, tc.verb, tc.cell)
		var ae *apiError
		if !errors.As(err, &ae) || ae.Status != tc.status || !strings.Contains(err.Error(), tc.msg) || !AgentAnswered(err) {
			t.Errorf("%s %s: %v, want the agent's %d answer %q", tc.verb, tc.cell, err, tc.status, tc.msg)
		}
	}
	if _, err := c.UpgradeRuntime(ctx, true); err != nil {
		t.Errorf("upgrade-runtime --dry-run: %v", err)
	}
	if _, err := c.UpgradeRuntime(ctx, false); err != nil {
		t.Errorf("upgrade-runtime: %v", err)
	}
	if fmt.Sprint(ctl.dryRun) != "[true false]" {
		t.Errorf("upgrades asked with dry runs %v, want [true false]", ctl.dryRun)
	}
	if pid, err := c.Shutdown(ctx); err != nil || pid != os.Getpid() || ctl.shutdowns != 1 {
		t.Errorf("shutdown: pid %d, %v (%d shutdowns)", pid, err, ctl.shutdowns)
	}
}

// TestAdminSocketRefusesASecondAgent: a socket another agent answers on is
// not taken over; a stale one (nobody answering) is replaced.
func TestAdminSocketRefusesASecondAgent(t *testing.T) {
	path := serveFake(t, &fakeController{})
	if srv, err := Listen(path, &fakeController{}, zap.NewNop()); err == nil {
		srv.Close()
		t.Fatal("a second agent took over a live admin socket")
	}

	stale := filepath.Join(t.TempDir(), "admin.sock")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := Listen(stale, &fakeController{}, zap.NewNop())
	if err != nil {
		t.Fatalf("a stale socket file: %v", err)
	}
	srv.Close()
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left the socket: %v", err)
	}
}

// TestAgentAnswered: failing to reach the agent is not its answer.
func TestAgentAnswered(t *testing.T) {
	_, err := NewClient(filepath.Join(t.TempDir(), "none.sock")).Status(context.Background())
	if err == nil || AgentAnswered(err) {
		t.Errorf("no agent: %v (answered: %v)", err, AgentAnswered(err))
	}
}
