"""The machine settings a repo's running parts read: their own declarations (`rediacc_core.setting`).

`lease-end` is applied by `lapsed.py`, `image-store` by `daemon.py` at a repo's up, and
`gate-workers` by `serve.py`, which starts the workers `workers.py` runs. Those modules read the
settings file, so its reader cannot import them: they declare here, in a module that reads nothing,
on the reader's floor (`tests/test_layers.py`).
"""

from __future__ import annotations

from rediacc_core.setting import Setting

# Each gate worker (`runtime.workers`) holds 1/N of the gate's buffer budget (64 MiB), and that share
# must still fit the largest body the gate reads and decides (4 MiB): so 16 at most. More event loops
# would not help either: they all wait on the one daemon.
MAX_WORKERS = 16


def check_worker_setting(value: str) -> str | None:
    """Why `value` is no valid `gate-workers` setting, or None."""
    if value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_WORKERS:
        return None
    return f"use a whole number from 1 to {MAX_WORKERS}"


LEASE_END = Setting(
    "lease-end",
    ("keep", "stop"),
    "keep",
    "a running container whose grant ended (a lease's end, a revoke without --stop): keep it "
    "running until it stops (it cannot start again), or have the repo's gate stop it within 30 s",
)
IMAGE_STORE = Setting(
    "image-store",
    ("overlay2", "containerd"),
    "overlay2",
    "where each repo's daemon keeps images and container layers: Docker's overlay2 driver, or the "
    "containerd image store (containerd snapshotter, the default of fresh Engine 29 installs) in "
    "the repo's own containerd; taken at the repo's next up, and a repo sees only the images of "
    "the store it runs with",
)
GATE_WORKERS = Setting(
    "gate-workers",
    (),
    "1",
    "processes each repo's gate serves from (1 to 16): more let a repo's API calls use more CPUs "
    "where CPUs sit idle, each costs its own memory; taken at the gate's next start",
    check_worker_setting,
    form="1-16",
)
NET_PATH = Setting(
    "net-path",
    ("auto", "kernel", "user"),
    "auto",
    "how each repo's network namespace reaches the outside: a veth pair routed and masqueraded by "
    "the host's kernel (kernel: at the host's speed, needs the host's IPv4 forwarding on, which rdc "
    "never turns on), slirp4netns in user space (user), or kernel where the host forwards and user "
    "where it does not (auto); taken at the repo's next up (rdc repo list -o wide shows each repo's)",
)
