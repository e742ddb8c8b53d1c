#!/bin/sh
# cellvisor-control postinstall: the deb postinst ("configure" [old version])
# and the rpm %post (1 on installation, 2 or more on upgrade).
#
# Creates the user and the data directory, reloads systemd's units, and on an
# upgrade restarts the control API if it was running (try-restart: edges retry
# their polls). It enables and starts nothing on installation. Without systemd
# as the init it touches no unit and says so.
set -e

name=cellvisor-control
unit=cellvisor-control.service

upgrade=no
case "$1" in
	configure) [ -z "$2" ] || upgrade=yes ;;
	abort-upgrade | abort-remove | abort-deconfigure) ;;
	[0-9]*) [ "$1" -lt 2 ] || upgrade=yes ;;
	*) echo "$name postinstall: unknown argument '$1'" >&2; exit 1 ;;
esac

if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers /usr/lib/sysusers.d/$name.conf
else
	getent group $name >/dev/null || groupadd --system $name
	getent passwd $name >/dev/null || useradd --system --gid $name \
		--home-dir /var/lib/$name --no-create-home --shell /usr/sbin/nologin \
		--comment "cellvisor control API" $name
fi
if command -v systemd-tmpfiles >/dev/null 2>&1; then
	systemd-tmpfiles --create /usr/lib/tmpfiles.d/$name.conf
else
	install -d -m 0700 -o $name -g $name /var/lib/$name
fi
# control.env may hold a database URL with a password: readable by root and
# the service's group only.
if [ -f /etc/cellvisor/control.env ]; then
	chown root:$name /etc/cellvisor/control.env
	chmod 0640 /etc/cellvisor/control.env
fi

if [ ! -d /run/systemd/system ]; then
	echo "$name: systemd is not running: no unit reloaded, nothing restarted"
else
	systemctl daemon-reload || echo "$name: systemctl daemon-reload failed (ignored)" >&2
	if [ "$upgrade" = yes ]; then
		systemctl try-restart $unit || echo "$name: systemctl try-restart $unit failed (see journalctl -u $unit)" >&2
	fi
fi

if [ "$upgrade" = no ]; then
	echo "$name: installed; not enabled or started. Edit /etc/cellvisor/control.env, then"
	echo "$name: systemctl enable --now $unit (docs/operations.md)"
fi
exit 0
