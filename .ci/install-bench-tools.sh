#!/usr/bin/env bash
# What bench/ needs beyond the Docker Engine: a C compiler for its load generator, curl for bulk
# transfers. Idempotent; needs root.
set -euo pipefail
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
