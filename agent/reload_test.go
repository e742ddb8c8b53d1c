package agent

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"cellvisor/cgroup"
	"cellvisor/config"
	"cellvisor/supervisor"
)

func TestFixedChanges(t *testing.T) {
	base := config.Default()
	base.StateDir, base.RunDir, base.Slots = "/s", "/r", 2
	for _, tc := range []struct {
		name string
		edit func(*config.Agent)
		want []string
	}{
		{"nothing", func(*config.Agent) {}, nil},
		{"log level", func(c *config.Agent) { c.Log.Level = "warn" }, nil},
		{"live settings", func(c *config.Agent) {
			c.Limits.Memory *= 2
			c.Limits.CPU, c.Limits.PIDs = 2, 7
			c.Restart.RateLimit, c.Liveness.FailureThreshold = 9, 9
		}, nil},
		{"runtime upgrade policy and pace", func(c *config.Agent) {
			c.RuntimeUpgrade, c.RuntimeUpgradePace = "paced", config.Duration(time.Hour)
		}, nil},
		{"slot count", func(c *config.Agent) { c.Slots = 3 }, []string{"slots"}},
		{"a port and a path", func(c *config.Agent) { c.Ports.HTTPBase++; c.RunDir = "/elsewhere" },
			[]string{"run_dir", "ports.http_base"}},
		{"the cache size with the level", func(c *config.Agent) { c.Limits.Cache *= 2; c.Log.Level = "error" }, []string{"limits.cache"}},
		{"the log format", func(c *config.Agent) { c.Log.Format = "console" }, []string{"log.format"}},
		{"the metrics address", func(c *config.Agent) { c.Metrics.Listen = "127.0.0.1:9999" }, []string{"metrics.listen"}},
	} {
		next := base
		tc.edit(&next)
		if got := fixedChanges(base, next); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A control task after a reload (SIGHUP) is bounded by the reloaded drain
// timeout, not the one the agent started with: a.cfg is never updated by a
// reload (issue 33).
func TestReloadedDrainTimeoutBoundsControlTasks(t *testing.T) {
	cfg, topo, assign := standalone(t)
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg.OpenResty.Binary = bin // exists; nothing is started
	cg, err := cgroup.New(cgroup.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	sup, err := supervisor.New(supervisorOptions(cfg, topo, assign, cg, nil, zap.NewNop(), nil))
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: cfg, log: zap.NewNop(), sup: sup}
	before := a.taskTimeout()
	next := cfg
	next.Restart.DrainTimeout = config.Duration(cfg.Restart.DrainTimeout.D() + 4*time.Minute)
	if err := a.Reload(context.Background(), next); err != nil {
		t.Fatal(err)
	}
	if got, want := a.taskTimeout(), before+4*time.Minute; got != want {
		t.Errorf("control task bound %s after the drain timeout was reloaded 4m longer, want %s (it was %s)", got, want, before)
	}
}
