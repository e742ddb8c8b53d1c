#!/bin/sh
# cellvisor postinstall: the deb postinst ("configure" [old version], or
# "triggered" paths) and the rpm %post (1 on installation, 2 or more on
# upgrade).
#
# Creates the user and the directories, reloads systemd's units, and on an
# upgrade restarts the agent if it was running (try-restart). It enables and
# starts nothing on installation. Without systemd as the init (a container, a
# chroot, a build machine) it touches no unit and says so.
set -e

name=cellvisor
unit=cellvisor.service

# dpkg's file trigger (packaging/cellvisor.yaml): a package installed a new
# binary or module of the cells' runtime ($2 names the paths). A running agent
# is told at once: systemctl reload is its SIGHUP, on which it looks at its
# runtime again (and re-reads agent.yaml) and, by its runtime_upgrade policy,
# verifies the new runtime and rolls the cells onto it one at a time
# (docs/cells.md, "Runtime upgrades"). --no-block: dpkg does not wait for it.
# An agent that does not run looks when it starts. Nothing else is done.
if [ "$1" = triggered ]; then
	if [ -d /run/systemd/system ] && systemctl is-active --quiet $unit; then
		echo "$name: the cells' runtime changed ($2): telling the agent"
		systemctl reload --no-block $unit || echo "$name: systemctl reload $unit failed (ignored; the agent also watches the files)" >&2
	fi
	exit 0
fi

upgrade=no
case "$1" in
	configure) [ -z "$2" ] || upgrade=yes ;;
	abort-upgrade | abort-remove | abort-deconfigure) ;;
	[0-9]*) [ "$1" -lt 2 ] || upgrade=yes ;;
	*) echo "$name postinstall: unknown argument '$1'" >&2; exit 1 ;;
esac

# The user and its group (sysusers.d), then the state and run directories with
# their owner and mode (tmpfiles.d). Without the systemd tools, the same by hand.
if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers /usr/lib/sysusers.d/$name.conf
else
	getent group $name >/dev/null || groupadd --system $name
	getent passwd $name >/dev/null || useradd --system --gid $name \
		--home-dir /var/lib/$name --no-create-home --shell /usr/sbin/nologin \
		--comment "cellvisor edge agent" $name
	# One user per cell slot, each in a group of its own with the agent in it.
	for i in $(seq -w 1 32); do
		cell=$name-cell-$i
		getent group $cell >/dev/null || groupadd --system $cell
		getent passwd $cell >/dev/null || useradd --system --gid $cell \
			--home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin \
			--comment "cellvisor cell slot $i" $cell
		usermod -a -G $cell $name
	done
fi
if command -v systemd-tmpfiles >/dev/null 2>&1; then
	systemd-tmpfiles --create /usr/lib/tmpfiles.d/$name.conf
else
	install -d -m 0751 -o $name -g $name /var/lib/$name /run/$name
fi

if [ ! -d /run/systemd/system ]; then
	echo "$name: systemd is not running: no unit reloaded, nothing restarted"
else
	systemctl daemon-reload || echo "$name: systemctl daemon-reload failed (ignored)" >&2
	if [ "$upgrade" = yes ]; then
		# try-restart restarts the agent only if it was running. The cells keep
		# serving: they live in the cells' own scope, outside the unit's cgroup,
		# and a restart job is not a stop (docs/cgroups.md, "Under systemd");
		# the new agent adopts them (docs/operations.md, "Upgrade").
		systemctl try-restart $unit || echo "$name: systemctl try-restart $unit failed (see journalctl -u $unit)" >&2
	fi
fi

if [ "$upgrade" = no ]; then
	echo "$name: installed; not enabled or started. Edit /etc/cellvisor/agent.yaml, enroll, then"
	echo "$name: systemctl enable --now $unit (docs/operations.md)"
fi
exit 0
