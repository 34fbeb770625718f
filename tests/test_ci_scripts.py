"""The install scripts of `.ci` change only what they name: every apt-get that takes the system's dpkg
lock waits for it (a freshly booted Debian runs unattended-upgrades), an installed package is left
at the version the host chose, and the trixie pin is written only where none pins it already."""

from __future__ import annotations

import re
from pathlib import Path

CI = Path(__file__).parents[1] / ".ci"
LOCKING = re.compile(r"\bapt-get\b.*\b(update|install|download)\b")


def apt_calls(script: Path) -> list[str]:
    """Each command line (continuations joined) that runs apt-get update, install or download."""
    lines = script.read_text().replace("\\\n", " ").splitlines()
    return [line for line in lines if LOCKING.search(line) and not line.lstrip().startswith("#")]


def test_every_apt_get_on_the_system_waits_for_the_dpkg_lock() -> None:
    scripts = sorted(CI.glob("install-*.sh"))
    assert scripts
    for script in scripts:
        for call in apt_calls(script):
            private = "apt_opts" in call  # install-engine.sh: its own lists and cache, no system lock
            waits = "DPkg::Lock::Timeout=600" in call or '"${lock[@]}"' in call
            assert private or waits, f"{script.name}: {call}"


def test_install_docker_installs_only_what_is_missing_and_pins_trixie_once() -> None:
    text = (CI / "install-docker.sh").read_text()
    [install] = [c for c in apt_calls(CI / "install-docker.sh") if " install " in c]
    assert "haproxy" not in install and '"${extra[@]}"' in install  # never upgrades an installed one
    assert "for pkg in busybox-static haproxy slirp4netns iptables iproute2; do" in text
    assert "dpkg-query -W -f='${Status}' \"$pkg\"" in text
    pin = text.index("> /etc/apt/preferences.d/trixie-low")
    guard = text.rindex("if ! grep -rqsE '^Pin: release (n|a)=trixie' /etc/apt/preferences", 0, pin)
    assert "\nfi\n" not in text[guard:pin]


def test_tox_installs_the_engines_before_the_unit_envs_read_their_swaggers() -> None:
    import configparser

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(CI.parent / "tox.ini")
    order = [env.strip() for env in tox["tox"]["env_list"].split(",")]
    for unit in ("core", "nvidia", "dri", "amd", "all"):
        assert order.index("e2e") < order.index(unit) and order.index("e2e-28") < order.index(unit), order
