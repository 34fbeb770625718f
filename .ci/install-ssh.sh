#!/usr/bin/env bash
# Install the distribution's OpenSSH server and client (the fleet tests run a real sshd on a high
# loopback port; nothing here enables the system's own sshd service). Idempotent; needs root.
set -euo pipefail
if command -v ssh >/dev/null 2>&1 && command -v ssh-keyscan >/dev/null 2>&1 \
    && { command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; }; then
  echo "openssh: $(ssh -V 2>&1)"; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
# policy-rc.d keeps the package's postinst from starting the system sshd service.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; added_policy=1
fi
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null
[ "${added_policy:-0}" = 1 ] && rm -f /usr/sbin/policy-rc.d
ssh -V
