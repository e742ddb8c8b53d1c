package agent

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	"cellvisor/config"
	"cellvisor/supervisor"
)

// ErrReloadRefused marks a reloaded configuration that changes what only a
// restart of the agent can change.
var ErrReloadRefused = fmt.Errorf("configuration reload refused")

// liveFields clears what a reload may change while cells run: the log
// level, liveness checks, crash and operator restart settings, the
// cells' memory, CPU and PID limits, and the runtime upgrade policy and
// pace.
func liveFields(c config.Agent) config.Agent {
	c.Log.Level = ""
	c.Liveness = config.Liveness{}
	c.Restart = config.Restart{}
	c.Limits.Memory, c.Limits.CPU, c.Limits.PIDs = 0, 0, 0
	c.RuntimeUpgrade, c.RuntimeUpgradePace = "", 0
	return c
}

// fixedChanges names the settings that differ between old and next apart
// from the live ones ("slots", "ports.http_base"), by their YAML names: pure.
func fixedChanges(old, next config.Agent) []string {
	return diffFields("", reflect.ValueOf(liveFields(old)), reflect.ValueOf(liveFields(next)))
}

func diffFields(prefix string, a, b reflect.Value) []string {
	var out []string
	for i := 0; i < a.NumField(); i++ {
		f := a.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			name = strings.ToLower(f.Name)
		}
		x, y := a.Field(i), b.Field(i)
		if reflect.DeepEqual(x.Interface(), y.Interface()) {
			continue
		}
		if x.Kind() == reflect.Struct && x.NumField() > 0 && f.Type.PkgPath() != "" && strings.HasPrefix(f.Type.PkgPath(), "cellvisor/") {
			if sub := diffFields(prefix+name+".", x, y); len(sub) > 0 {
				out = append(out, sub...)
				continue
			}
		}
		out = append(out, prefix+name)
	}
	return out
}

// Reload applies a re-read configuration while the cells run: only the
// live settings may differ from the running configuration; otherwise
// nothing is applied and the error names what cannot change without a
// restart. The caller applies the log level. No cell is restarted; running
// cells' cgroups take new limits at once.
func (a *Agent) Reload(ctx context.Context, next config.Agent) error {
	if err := next.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrReloadRefused, err)
	}
	if fixed := fixedChanges(a.cfg, next); len(fixed) > 0 {
		return fmt.Errorf("%w: %s cannot change while the agent runs (restart the agent to change it)", ErrReloadRefused, strings.Join(fixed, ", "))
	}
	err := a.sup.Update(ctx, supervisor.Settings{
		Limits:             CellLimits(next),
		Policy:             supervisor.Policy{Initial: next.Restart.InitialDelay.D(), Max: next.Restart.MaxDelay.D(), HealthyAfter: next.Restart.HealthyAfter.D()},
		Liveness:           livenessPolicy(next.Liveness),
		RestartLimit:       next.Restart.RateLimit,
		RestartWindow:      next.Restart.RateWindow.D(),
		DrainTimeout:       next.Restart.DrainTimeout.D(),
		RuntimeUpgrade:     supervisor.UpgradePolicy(next.RuntimeUpgrade),
		RuntimeUpgradePace: next.RuntimeUpgradePace.D(),
	})
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	return nil
}

// CheckRuntime has the cells' binary and modules looked at again (a
// package installed without the watch seeing it): every SIGHUP does it,
// whether or not the configuration it re-reads is taken.
func (a *Agent) CheckRuntime() { a.sup.CheckRuntime() }
