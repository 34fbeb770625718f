#!/usr/bin/env bash
# Install Debian bookworm's own Slurm (22.05: slurmctld, slurmd, the client tools, slurmdbd with its
# MySQL plugin), MUNGE and MariaDB, at the versions bookworm ships, for the slurm suite (tests/slurm).
# Nothing is enabled or started here: the suite starts private daemons with their own configs, ports
# and spools. Installs only what it names; idempotent; needs root.
set -euo pipefail
pkgs=(slurmctld slurmd slurm-client munge slurmdbd slurm-wlm-mysql-plugin mariadb-server)
installed() {
  local p
  for p in "${pkgs[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || return 1
  done
}
if installed; then
  echo "slurm: $(slurmctld -V)"; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
apt_get update -qq
# The version bookworm (or its security suite) has, never a later suite's where the host lists one.
from_bookworm() {  # PACKAGE
  apt-cache madison "$1" | awk -F'|' '$3 ~ / bookworm(-security|-updates)?\// {gsub(/ /,"",$2); print $2; exit}'
}
want=()
for p in "${pkgs[@]}"; do
  v=$(from_bookworm "$p")
  if [ -z "$v" ]; then
    echo "install-slurm: bookworm has no $p (is a bookworm source configured?)" >&2
    exit 1
  fi
  want+=("$p=$v")
done
# policy-rc.d keeps the packages' postinst from starting the system's munge, slurm and MariaDB services.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; added_policy=1
fi
echo "installing ${want[*]}"
apt_get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
[ "${added_policy:-0}" = 1 ] && rm -f /usr/sbin/policy-rc.d
slurmctld -V
