#!/usr/bin/env bash
# Install Docker Engine 28.5 with its CLI, buildx 0.29, Compose 2.40 and containerd 2.1 from Debian sid
# into a private prefix, beside the system's Engine 26.1: the packages are downloaded with a private apt
# state (the system's sources, lists and packages stay as they are), checked against the pinned
# checksums and unpacked with dpkg-deb. The system's runc is kept (sid's needs glibc 2.38).
# Also extracts moby 28.5's swagger (API 1.51) for the gate's coverage test. Idempotent; needs root.
#
#   bash .ci/install-engine.sh            # -> /opt/rediacc/engines/28.5
#   RDC_ENGINE_PREFIX=/opt/rediacc/engines/28.5 tox -e e2e-28   # what the e2e-28 env does
set -euo pipefail
version=28.5
prefix=${RDC_ENGINE_PREFIX:-/opt/rediacc/engines/$version}
# package=version sha256 (Debian sid, amd64; a changed file or a version gone from sid stops here)
pins=(
  "docker.io=28.5.2+dfsg4-5 69a59cc77a1fb8ee9ad6859abc2e6de5d76b70887405595c2b1307818fecf682"
  "docker-cli=28.5.2+dfsg4-5 8ea2428acdda666f41263f5a0d3a85681a696491361574eb7bd721a1194939b9"
  "docker-buildx=0.29.1+ds1-4 6103bcc4eab8169ae679f806d3949ffc99a1545a61fddea6124da826f115f2bf"
  "docker-compose=2.40.3-3 e7603d5e6df0f8404f7b03da478022b87d7b50644cffe68884b071e5cfc17fd3"
  "containerd=2.1.9+ds1-5 2dda86ce7033fd612fc50e136679d8174ccad680eb29cd4611e0d2a1b84cf591"
  "tini=0.19.0-6+b2 e007612f456a990906f4f63d4a33904a7b0f30f3e56f2dd1fa0388ba61d550b0"
  "golang-github-docker-docker-dev=28.5.2+dfsg4-5 e4be8c287680dc726917da2d91ae43dc90ebaa097f32bf4f828da077e4a2f7fd"
)
stamp="$prefix/.installed"
want=$(printf '%s\n' "${pins[@]}" | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "engine $version: $("$prefix/usr/sbin/dockerd" --version)"; exit 0
fi
command -v dpkg-deb >/dev/null && command -v apt-get >/dev/null || { echo "needs apt-get and dpkg-deb (Debian)" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs" "$work/none"
# The first stanza of the system's sources (its mirror and keyring), re-pointed at sid.
src=/etc/apt/sources.list.d/debian.sources
uri=$(awk '/^URIs:/{print $2; exit}' "$src" 2>/dev/null || true)
key=$(awk '/^Signed-By:/{print $2; exit}' "$src" 2>/dev/null || true)
printf 'Types: deb\nURIs: %s\nSuites: sid\nComponents: main\nSigned-By: %s\n' \
  "${uri:-http://deb.debian.org/debian}" "${key:-/usr/share/keyrings/debian-archive-keyring.gpg}" > "$work/sid.sources"
apt_opts=(-o "Dir::Etc::sourcelist=$work/sid.sources" -o "Dir::Etc::sourceparts=$work/none" -o "Dir::State::Lists=$work/lists"
  -o "Dir::Cache=$work/cache" -o "Dir::Etc::preferences=/dev/null" -o "Dir::Etc::preferencesparts=$work/none"
  -o "APT::Sandbox::User=root")
apt-get "${apt_opts[@]}" update -qq
names=()
for pin in "${pins[@]}"; do names+=("${pin%% *}"); done
(cd "$work/debs" && apt-get "${apt_opts[@]}" download -qq "${names[@]}")
for pin in "${pins[@]}"; do
  pkgver=${pin%% *}; sum=${pin##* }; pkg=${pkgver%%=*}; ver=${pkgver#*=}
  deb=$(ls "$work/debs/${pkg}_${ver//:/%3a}_"*.deb)
  echo "$sum  $deb" | sha256sum -c --quiet - || { echo "checksum mismatch: $deb" >&2; exit 1; }
done
rm -rf "$prefix.new"; mkdir -p "$prefix.new"
for deb in "$work"/debs/*.deb; do
  case "$deb" in *golang-github-docker-docker-dev*) continue ;; esac
  dpkg-deb -x "$deb" "$prefix.new"
done
dpkg-deb -x "$work"/debs/golang-github-docker-docker-dev_*.deb "$work/moby"
cp "$work/moby/usr/share/gocode/src/github.com/docker/docker/api/swagger.yaml" "$prefix.new/swagger.yaml"
# docker-init names sid's tini-static, which another package ships: the dynamic tini serves here.
[ -e "$prefix.new/usr/bin/tini-static" ] || ln -sfn tini "$prefix.new/usr/bin/docker-init"
# Only what runs: service files and docs stay out.
rm -rf "$prefix.new/etc" "$prefix.new/lib/systemd" "$prefix.new/usr/share"
rm -rf "$prefix"; mv "$prefix.new" "$prefix"
echo "$want" > "$stamp"
echo "engine $version: $("$prefix/usr/sbin/dockerd" --version); CLI $("$prefix/usr/bin/docker" --version)"
