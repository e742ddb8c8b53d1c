#!/bin/sh
# cellvisor-control postremove: the deb postrm ("remove", "purge", "upgrade",
# ...) and the rpm %postun (0 on erasure, 1 or more on upgrade).
#
# A purge does NOT delete /var/lib/cellvisor-control: it holds the control
# plane's CA, its signing keys (sealed) and the seal key. Without them no
# enrolled edge can be reached or verify a manifest again, so they go only by
# an operator's hand (docs/operations.md, "Uninstall"). dpkg deletes
# /etc/cellvisor/control.env itself on purge. The user and group stay (Debian
# and Fedora policy).
set -e

name=cellvisor-control

if [ "$1" = purge ]; then
	rmdir /etc/cellvisor 2>/dev/null || true
	if [ -d /var/lib/$name ]; then
		echo "$name: kept /var/lib/$name (the CA, the keys and the store): delete it yourself if the control plane is gone for good"
	fi
fi

case "$1" in
	remove | 0)
		if [ -d /run/systemd/system ]; then
			systemctl daemon-reload || echo "$name: systemctl daemon-reload failed (ignored)" >&2
		fi
		;;
esac
exit 0
