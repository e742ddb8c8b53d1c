#!/bin/sh
# cellvisor-control preremove: the deb prerm ("remove", "upgrade", ...) and
# the rpm %preun (0 on erasure, 1 or more on upgrade).
#
# On removal it stops the control API and disables the unit. On an upgrade it
# does nothing: the new package's postinstall restarts the control API.
set -e

name=cellvisor-control
unit=cellvisor-control.service

case "$1" in
	remove | 0) ;;
	*) exit 0 ;;
esac

if [ ! -d /run/systemd/system ]; then
	echo "$name: systemd is not running: nothing to stop"
	exit 0
fi
systemctl stop $unit || echo "$name: systemctl stop $unit failed (ignored)" >&2
systemctl --no-reload disable $unit || echo "$name: systemctl disable $unit failed (ignored)" >&2
exit 0
