#!/usr/bin/env bash
# Build a Debian sid root holding Slurm >= 25.05 (slurmctld, slurmdbd with its MySQL plugin, the client
# tools), MUNGE and MariaDB, for the external-mode suite (tests/slurm_ext). Installing sid's Slurm on the
# host would replace its libc, so these run inside the root (chroot) instead. Nothing is started here.
# Idempotent: a finished root is a fast no-op; a build goes to a side directory and is moved into place
# only once complete, so an interrupted build leaves nothing half-made behind. Needs root and the network.
# RDC_SLURM_SID_ROOT picks the directory (default /var/cache/rediacc/sid-slurm).
set -euo pipefail
root=${RDC_SLURM_SID_ROOT:-/var/cache/rediacc/sid-slurm}
pkgs=(slurmctld slurmdbd slurm-client munge mariadb-server slurm-wlm-mysql-plugin)
version() { chroot "$root" slurmctld -V; }
if [ -e "$root/.rdc-slurm-sid-ready" ] && [ "$(cat "$root/.rdc-slurm-sid-ready")" = "${pkgs[*]}" ]; then
  echo "slurm (sid root $root): $(version)"; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
if ! command -v debootstrap >/dev/null; then
  apt_get update -qq
  apt_get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
# The Debian mirror the host already uses (deb822 or one-line sources), so no host is named here.
mirror=$(
  { grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' || true
    grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | sed -E 's/^deb (\[[^]]*\] )?//' | awk '{print $1}' || true
  } | grep -E '/debian/?$' | head -n1 || true
)
if [ -z "$mirror" ]; then
  echo "install-slurm-sid: the host's apt sources name no Debian mirror (a URI ending in /debian)" >&2
  exit 1
fi
build="$root.partial"
cleanup() {
  umount "$build/proc" 2>/dev/null || true
  rm -rf "$build"
}
trap cleanup EXIT
cleanup
mkdir -p "$(dirname "$root")"
echo "install-slurm-sid: debootstrap sid from $mirror into $build"
debootstrap --variant=minbase sid "$build" "$mirror" >/dev/null
# policy-rc.d keeps the packages' postinst from starting munge, Slurm or MariaDB inside the root.
printf '#!/bin/sh\nexit 101\n' > "$build/usr/sbin/policy-rc.d"; chmod +x "$build/usr/sbin/policy-rc.d"
mount -t proc proc "$build/proc"
chroot "$build" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
chroot "$build" apt-get clean
# debootstrap leaves no /etc/hosts; MariaDB's installer must resolve localhost.
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$build/etc/hosts"
umount "$build/proc"
echo "${pkgs[*]}" > "$build/.rdc-slurm-sid-ready"
rm -rf "$root"
mv "$build" "$root"
trap - EXIT
echo "slurm (sid root $root): $(version)"
