package agent

import (
	"slices"
	"testing"

	"cellvisor/config"
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
