// Package systemd is the agent's systemd glue: readiness, status and stopping
// notifications through sd_notify, and the watchdog, which pings only while
// every watched long-running loop is alive (Health). Outside systemd every
// call is a no-op. The unit files live beside it. agent and
// cmd/cellvisor-control import it.
package systemd

import (
	"context"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"

	"cellvisor/internal/clock"
)

// Notifier sends sd_notify messages.
type Notifier struct {
	log *zap.Logger
	clk clock.Clock
}

// New returns a Notifier logging to log (nil for none).
func New(log *zap.Logger) *Notifier {
	if log == nil {
		log = zap.NewNop()
	}
	return &Notifier{log: log.Named("systemd"), clk: clock.Real}
}

func (n *Notifier) send(state string) {
	sent, err := daemon.SdNotify(false, state)
	switch {
	case err != nil:
		n.log.Warn("sd_notify", zap.String("state", state), zap.Error(err))
	case !sent:
		n.log.Debug("not running under systemd", zap.String("state", state))
	}
}

// Ready tells systemd start-up is complete.
func (n *Notifier) Ready() { n.send(daemon.SdNotifyReady) }

// Stopping tells systemd the agent is shutting down.
func (n *Notifier) Stopping() { n.send(daemon.SdNotifyStopping) }

// Status sets the one-line status systemctl shows.
func (n *Notifier) Status(s string) { n.send("STATUS=" + s) }

// Watchdog pings systemd at half the WATCHDOG_USEC interval until ctx ends,
// while check returns nil. While it returns an error no ping is sent, so
// systemd kills and restarts the agent once WatchdogSec passes; the first
// failed check is logged with its reason, and so is the recovery. It returns
// at once when no watchdog is set for this process.
func (n *Notifier) Watchdog(ctx context.Context, check func() error) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		n.log.Warn("watchdog setting", zap.Error(err))
		return
	}
	if interval == 0 {
		n.log.Debug("no watchdog set")
		return
	}
	t := n.clk.NewTicker(interval / 2)
	defer t.Stop()
	var failing error
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		err := check()
		switch {
		case err != nil && failing == nil:
			n.log.Error("watchdog: not pinging systemd, it restarts the agent unless this clears", zap.Duration("watchdog", interval), zap.Error(err))
		case err == nil && failing != nil:
			n.log.Info("watchdog: healthy again, pinging systemd")
		}
		failing = err
		if err == nil {
			n.send(daemon.SdNotifyWatchdog)
		}
	}
}
