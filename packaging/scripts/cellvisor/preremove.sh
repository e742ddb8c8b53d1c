#!/bin/sh
# cellvisor preremove: the deb prerm ("remove", "upgrade", ...) and the rpm
# %preun (0 on erasure, 1 or more on upgrade).
#
# On removal it stops the agent, which stops its cells gracefully, and
# disables the unit. On an upgrade it does nothing: the new package's
# postinstall restarts the agent.
set -e

name=cellvisor
unit=cellvisor.service
scope=cellvisor-cells.scope
slice=cellvisor.slice

case "$1" in
	remove | 0) ;;
	*) exit 0 ;;
esac

if [ ! -d /run/systemd/system ]; then
	echo "$name: systemd is not running: nothing to stop"
	exit 0
fi
systemctl stop $unit || echo "$name: systemctl stop $unit failed (ignored)" >&2
# The agent's stop ends the cells and their scope. Cells that outlived an
# agent which is not running (it crashed and was not started again) are
# stopped here by systemd (SIGTERM, not a graceful stop): they must not
# go on running from a removed binary.
if systemctl is-active --quiet $scope; then
	echo "$name: stopping $scope (cells left running without an agent)"
	systemctl stop $scope || echo "$name: systemctl stop $scope failed (ignored)" >&2
fi
# The unit's slice (cellvisor.slice) is not stopped with the unit: stop it,
# so that no cgroup of cellvisor's stays behind the package.
if systemctl is-active --quiet $slice; then
	systemctl stop $slice || echo "$name: systemctl stop $slice failed (ignored)" >&2
fi
systemctl --no-reload disable $unit || echo "$name: systemctl disable $unit failed (ignored)" >&2
exit 0
