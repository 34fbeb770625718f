"""Render nodes on a simulated machine, laid out the way the kernel lays them out.

For tests of this plugin and of anything built on it. `add_render_node` builds a node from scratch;
`install_drm_capture` puts a real `/sys/class/drm` capture (device directories copied byte for
byte) behind render nodes. Real captures of `device/` directories exist, but none of a render node
entry itself, so the `renderD<N>` entries and `/dev/dri` nodes are made here, as the kernel makes them.
"""

from __future__ import annotations

import re
from pathlib import Path

from rediacc_core.testing import FakeMachine, real_capture
from rediacc_dri.discovery import RENDER_MAJOR

PCI_SLOT = re.compile(r"^PCI_SLOT_NAME=(\S+)$", re.M)


def add_render_node(
    fm: FakeMachine,
    minor: int,
    bdf: str | None,
    vendor: int = 0x8086,
    device: int = 0x5917,
    driver: str | None = "i915",
    card: int | None = None,
    device_path: str | None = None,
) -> str:
    """`/dev/dri/renderD<minor>` and its sysfs entry, owned by the PCI function `bdf`.

    With `bdf` None the node hangs off `device_path` (e.g. a platform device such as a GPU partition,
    which has no PCI function of its own). `card` also makes the primary node `card<card>`. Returns the
    sysfs path of the owning device.
    """
    if bdf is not None:
        parent = fm.pci_device(bdf, vendor, device, driver=driver)
    elif device_path is not None:
        parent = device_path
        if not fm.path(f"{parent}/uevent").exists():
            fm.write(f"{parent}/uevent", f"DRIVER={driver}\n" if driver else "")
    else:
        raise ValueError("a render node needs a PCI function (bdf) or a device_path")
    _drm_entry(fm, parent, f"renderD{minor}", minor)
    if card is not None:
        _drm_entry(fm, parent, f"card{card}", card)
    return parent


def _drm_entry(fm: FakeMachine, parent: str, name: str, minor: int) -> None:
    entry = f"{parent}/drm/{name}"
    fm.write(f"{entry}/dev", f"{RENDER_MAJOR}:{minor}\n")
    fm.write(
        f"{entry}/uevent", f"MAJOR={RENDER_MAJOR}\nMINOR={minor}\nDEVNAME=dri/{name}\nDEVTYPE=drm_minor\n"
    )
    fm.symlink(f"{entry}/device", parent)
    fm.symlink(f"{entry}/subsystem", "/sys/class/drm")
    fm.symlink(f"/sys/class/drm/{name}", entry)
    fm.char_device(f"/dev/dri/{name}", RENDER_MAJOR, minor)


def add_by_path_links(fm: FakeMachine, bdf: str, render_minor: int, card: int | None = None) -> None:
    """udev's `/dev/dri/by-path/pci-<bdf>-{render,card}` links."""
    fm.symlink(f"/dev/dri/by-path/pci-{bdf}-render", f"/dev/dri/renderD{render_minor}")
    if card is not None:
        fm.symlink(f"/dev/dri/by-path/pci-{bdf}-card", f"/dev/dri/card{card}")


def intel_igpu(fm: FakeMachine) -> None:
    """A laptop's integrated Intel GPU (UHD 620 at 00:02.0): card0 and renderD128."""
    add_render_node(fm, 128, "0000:00:02.0", 0x8086, 0x5917, "i915", card=0)


# --- real captures -----------------------------------------------------------------------------


def drm_capture_dir(name: str = "prometheus-procfs-fixture") -> Path:
    """`/sys/class/drm` of a stored capture (the test skips when the captures are not here)."""
    return real_capture("drm", name, "sys", "class", "drm")


def install_drm_capture(fm: FakeMachine, capture: Path, first_render_minor: int = 128) -> dict[str, int]:
    """Put each `card<M>/device` of `capture` at its PCI address and give it a render node.

    The device directory is copied as captured. Render minors are handed out from
    `first_render_minor` in card order, as the kernel does for one render node per card. Returns
    {card name: render minor}.
    """
    given: dict[str, int] = {}
    minor = first_render_minor
    cards = sorted(
        (p for p in capture.iterdir() if re.match(r"^card\d+$", p.name)), key=lambda p: int(p.name[4:])
    )
    for card_dir in cards:
        device = card_dir / "device"
        match = PCI_SLOT.search((device / "uevent").read_text(encoding="utf-8"))
        if match is None:
            continue  # not a PCI device: nothing in the captures is like that
        bdf = match.group(1).lower()
        parent = f"/sys/devices/pci{bdf[:4]}:{bdf[5:7]}/{bdf}"
        fm.copy_tree(device, parent)
        _drm_entry(fm, parent, card_dir.name, int(card_dir.name[4:]))
        _drm_entry(fm, parent, f"renderD{minor}", minor)
        given[card_dir.name] = minor
        minor += 1
    return given
