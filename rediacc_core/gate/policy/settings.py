"""The machine settings the gate's policy reads: its own declarations (`rediacc_core.setting`).

Each value is checked by the policy module that applies it (`mounts`, `isolation`, `limits`,
`fetches`), imported when a value is checked rather than here: every `rdc` command that reads the
settings file (`rdc machine list` among them) imports this module, and the policy's modules would
cost it about 30 ms on this project's 2-core host. `legacy-visible-devices` is read by the vendor
plugins' rules, to which the field policy leaves a container's environment.
"""

from __future__ import annotations

from rediacc_core.setting import Setting
from rediacc_core.values import split_list


def _check_bind_roots(value: str) -> str | None:
    from rediacc_core.gate.policy.mounts import check_root_setting

    for item in split_list(value):
        path = item.removesuffix(":ro")
        why = check_root_setting(path)
        if why:
            return f"bind root {item!r}: {why}"
    return None


def _check_capabilities(value: str) -> str | None:
    from rediacc_core.gate.policy.isolation import GRANTABLE_CAPABILITIES, capability_name

    for item in split_list(value):
        if capability_name(item) not in GRANTABLE_CAPABILITIES:
            return (
                f"capability {item!r} cannot be allowed (it reaches the host, or is unknown); "
                f"allowable: {', '.join(sorted(GRANTABLE_CAPABILITIES))}"
            )
    return None


def _check_names(value: str) -> str | None:
    for item in split_list(value):
        if not all(c.isalnum() or c in "-_./:" for c in item):
            return f"{item!r} is not a volume driver name"
    return None


def _check_pids(value: str) -> str | None:
    from rediacc_core.gate.policy.limits import check_pids_setting

    return check_pids_setting(value)


def _check_registries(value: str) -> str | None:
    from rediacc_core.gate.policy.fetches import check_allowed_setting

    return check_allowed_setting(value)


LEGACY_VISIBLE_DEVICES = Setting(
    "legacy-visible-devices",
    ("refuse", "translate"),
    "refuse",
    "a container request that selects GPUs through a vendor's visible-devices variable: refuse it, "
    "naming the CDI devices to use, or translate it into those CDI devices when all are granted",
)
BIND_ROOTS = Setting(
    "bind-roots",
    (),
    "",
    "host directories containers may bind besides the repo's own files directory, comma-separated; "
    "':ro' after one forces read-only binds (/data/datasets:ro,/srv/shared)",
    _check_bind_roots,
    form="DIR[:ro],…",
)
EXTRA_CAPABILITIES = Setting(
    "extra-capabilities",
    (),
    "",
    "capabilities beyond Docker's default set that containers may add, comma-separated (NET_ADMIN)",
    _check_capabilities,
    form="CAPABILITY,…",
)
VOLUME_DRIVERS = Setting(
    "volume-drivers",
    (),
    "",
    "volume drivers besides 'local' that repos may use, comma-separated",
    _check_names,
    form="DRIVER,…",
)
PIDS_LIMIT = Setting(
    "pids-limit",
    (),
    "4096",
    "the most processes a container may have (1 to 4194304): written into every container that "
    "asks for no limit or for unlimited, and a request for more refused, so that no container "
    "can use up the host's process ids",
    _check_pids,
    form="1-4194304",
)
REGISTRIES = Setting(
    "registries",
    (),
    "",
    "loopback or link-local registries and servers the daemon may fetch from for a repo (pulls, "
    "pushes, logins, build remotes, imports), comma-separated host or host:port "
    "(localhost:5000,[::1]:5000); a host without a port allows each of its ports",
    _check_registries,
    form="HOST[:PORT],…",
)
