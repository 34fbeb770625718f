#!/usr/bin/env bash
# Install Docker Engine >= 25 (CDI capable) and Compose v2 from Debian trixie, pinned low so
# nothing else on this bookworm machine is upgraded. Idempotent; needs root.
set -euo pipefail
have_cdi_dockerd() {
  command -v dockerd >/dev/null 2>&1 || return 1
  local v; v=$(dockerd --version | sed -E 's/^Docker version ([0-9]+).*/\1/')
  [ "${v:-0}" -ge 25 ]
}
# The Engine API swagger the gate's allow-list is checked against (API 1.45, Docker 26.1): the file
# ships in Debian's Go sources of moby; it is extracted, not installed (no Go toolchain pulled in).
install_api_swagger() {
  local dest=/var/cache/rediacc/docker-api
  [ -s "$dest/swagger.yaml" ] && return 0
  local v tmp; tmp=$(mktemp -d)
  v=$(apt-cache madison golang-github-docker-docker-dev | awk -F'|' '{gsub(/ /,"",$2); print $2}' | grep -E '^26\.' | head -n1)
  (cd "$tmp" && apt-get -o DPkg::Lock::Timeout=600 download -qq "golang-github-docker-docker-dev=$v" >/dev/null)
  dpkg-deb -x "$tmp"/golang-github-docker-docker-dev_*.deb "$tmp/x"
  mkdir -p "$dest"
  cp "$tmp/x/usr/share/gocode/src/github.com/docker/docker/api/swagger.yaml" "$dest/swagger.yaml"
  rm -rf "$tmp"
}
# The e2e kit's image is a static busybox: any other busybox on PATH is not enough.
have_static_busybox() {
  [ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" = "install ok installed" ]
}
if have_cdi_dockerd && [ -s /var/cache/rediacc/docker-api/swagger.yaml ] && have_static_busybox && { docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; } \
  && docker buildx version >/dev/null 2>&1 && command -v slirp4netns >/dev/null 2>&1; then
  echo "docker engine: $(dockerd --version)"; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
src=/etc/apt/sources.list.d/debian.sources
# Trixie is added once: not again where any configured source already names it (on trixie itself,
# or a host that lists it elsewhere), which apt would warn about as a duplicate on every update.
if ! grep -rqsE '(^|[[:space:]])trixie([[:space:]]|$)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  # First stanza's Types/URIs/Signed-By, re-pointed at trixie main.
  awk 'BEGIN{RS="";FS="\n"} NR==1{for(i=1;i<=NF;i++) if ($i ~ /^(Types|URIs|Signed-By):/) print $i; exit}' "$src" \
    > /tmp/trixie.head
  { cat /tmp/trixie.head; echo "Suites: trixie"; echo "Components: main"; } > /etc/apt/sources.list.d/trixie.sources
fi
# Pinned once: not again where any preferences file already pins trixie.
if ! grep -rqsE '^Pin: release (n|a)=trixie' /etc/apt/preferences /etc/apt/preferences.d/; then
  printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' > /etc/apt/preferences.d/trixie-low
fi
# A freshly booted host runs unattended-upgrades: wait for the dpkg lock rather than fail.
lock=(-o DPkg::Lock::Timeout=600)
apt-get "${lock[@]}" update -qq
# The versions README names, taken from trixie only: a host that also lists sid (or backports) would
# otherwise get whatever is highest there.
from_trixie() {  # PACKAGE VERSION-PREFIX
  apt-cache madison "$1" | awk -F'|' -v want="^$2" '$3 ~ / trixie\// {gsub(/ /,"",$2); if ($2 ~ want) {print $2; exit}}'
}
dv=$(from_trixie docker.io '26\.1\.')
cv=$(from_trixie docker-compose '2\.26\.1')
# buildx too: the 26.1 CLI then builds with BuildKit, as a user's does (without it, the legacy builder).
bv=$(from_trixie docker-buildx '0\.13\.1')
if [ -z "$dv" ] || [ -z "$cv" ] || [ -z "$bv" ]; then
  echo "trixie no longer has docker.io 26.1, docker-compose 2.26.1 or docker-buildx 0.13.1 (found: '$dv' '$cv' '$bv')" >&2
  exit 1
fi
echo "installing docker.io=$dv docker-compose=$cv docker-buildx=$bv"
# Only what is missing: an installed haproxy, iptables ... stays the version the host chose.
extra=()
for pkg in busybox-static haproxy slirp4netns iptables iproute2; do
  [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" = "install ok installed" ] || extra+=("$pkg")
done
apt-get "${lock[@]}" install -y -qq --no-install-recommends "docker.io=$dv" "docker-compose=$cv" "docker-buildx=$bv" \
  "${extra[@]}" >/dev/null
install_api_swagger
dockerd --version
