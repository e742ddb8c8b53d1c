#!/bin/sh
# cellvisor postremove: the deb postrm ("remove", "purge", "upgrade", ...) and
# the rpm %postun (0 on erasure, 1 or more on upgrade).
#
# On a deb purge it deletes the state, run and log directories: the edge's identity
# (re-enroll, or rotate the identity, to bring the host back), the cells'
# releases, caches and logs. dpkg deletes /etc/cellvisor's configuration files
# itself. The user and group stay (Debian and Fedora policy: files they owned
# may survive elsewhere, in a backup for instance). rpm has no purge: erasure
# keeps the state directory, and an edited agent.yaml as agent.yaml.rpmsave.
set -e

name=cellvisor

if [ "$1" = purge ]; then
	rm -rf /var/lib/$name /run/$name /var/log/$name
	rmdir /etc/cellvisor 2>/dev/null || true
fi

case "$1" in
	remove | 0)
		if [ -d /run/systemd/system ]; then
			# The pre-removal script stops the agent, its cells and its
			# slice; where it did not run (a failed upgrade left the
			# package half-configured, then it was purged), nothing of
			# cellvisor's may go on running from removed files.
			for u in cellvisor.service cellvisor-cells.scope cellvisor.slice; do
				if systemctl is-active --quiet "$u"; then
					echo "$name: stopping $u"
					systemctl stop "$u" || echo "$name: systemctl stop $u failed (ignored)" >&2
				fi
			done
			systemctl daemon-reload || echo "$name: systemctl daemon-reload failed (ignored)" >&2
		fi
		;;
esac
exit 0
