// Package systemd is the agent's systemd glue: readiness, status and stopping
// notifications and the watchdog, through sd_notify. Outside systemd every
// call is a no-op. The unit files live beside it.
package systemd

import (
	"context"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
)

// Notifier sends sd_notify messages.
type Notifier struct {
	log *zap.Logger
}

// New returns a Notifier logging to log (nil for none).
func New(log *zap.Logger) *Notifier {
	if log == nil {
		log = zap.NewNop()
	}
	return &Notifier{log: log.Named("systemd")}
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
// while healthy reports true. It returns at once when no watchdog is set.
func (n *Notifier) Watchdog(ctx context.Context, healthy func() bool) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil || interval == 0 {
		return
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if healthy() {
				n.send(daemon.SdNotifyWatchdog)
			}
		}
	}
}
