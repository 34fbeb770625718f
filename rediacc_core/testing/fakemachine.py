"""A simulated machine: a directory laid out the way the Linux kernel lays out `/sys`, `/dev`, `/proc`.

Code under test reads it through `Machine.path`, exactly as it reads `/` on a real host. Stand-in
executables (for vendor tools that cannot run here) go into the machine's own `/usr/bin`, where
`Machine.which` finds a rooted machine's tools: the host's PATH is never asked.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from rediacc_core.machine import Machine


class FakeMachine:
    """Builds a fake machine root. Every path argument is absolute as the machine sees it."""

    def __init__(self, root: Path, bin_dir: Path | None = None, name: str = "fake") -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.machine = Machine(name=name, root=root)
        self.bin_dir = bin_dir if bin_dir is not None else self.machine.tool_dir
        self.bin_dir.mkdir(parents=True, exist_ok=True)

    def path(self, absolute: str) -> Path:
        return self.machine.path(absolute)

    # --- plain filesystem -----------------------------------------------------------------------
    def write(self, absolute: str, text: str, mode: int = 0o644) -> Path:
        target = self.path(absolute)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        target.chmod(mode)
        return target

    def mkdir(self, absolute: str) -> Path:
        target = self.path(absolute)
        target.mkdir(parents=True, exist_ok=True)
        return target

    def symlink(self, absolute: str, points_to: str) -> Path:
        """A link at `absolute`; an absolute `points_to` is made relative so it stays inside the root."""
        link = self.path(absolute)
        link.parent.mkdir(parents=True, exist_ok=True)
        target = points_to
        if points_to.startswith("/"):
            target = os.path.relpath(self.path(points_to), link.parent)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
        return link

    def char_device(self, absolute: str, major: int, minor: int, mode: int = 0o666) -> Path:
        """A character device node with the given numbers.

        As root it is a real node (`mknod`), which a real Docker daemon can inject into a container.
        Otherwise a regular file stands in and `<path>.devnum` records the numbers; readers that
        need the numbers use `device_numbers()`.
        """
        node = self.path(absolute)
        node.parent.mkdir(parents=True, exist_ok=True)
        if node.exists() or node.is_symlink():
            node.unlink()
        try:
            os.mknod(node, stat.S_IFCHR | mode, os.makedev(major, minor))
        except PermissionError:
            node.write_text("")
            node.with_name(node.name + ".devnum").write_text(f"{major}:{minor}\n")
        return node

    def copy_tree(self, source: Path, absolute: str) -> Path:
        """Copy a captured tree's files under `absolute` (contents only, modes not copied).

        Captures are often read-only; copying their modes would make the fake root unwritable.
        """
        target = self.path(absolute)
        for here, dirs, files in os.walk(source):
            into = target / Path(here).relative_to(source)
            into.mkdir(parents=True, exist_ok=True)
            for name in files:
                shutil.copyfile(Path(here) / name, into / name)
            dirs.sort()
        return target

    # --- PCI ------------------------------------------------------------------------------------
    def pci_device(
        self,
        bdf: str,
        vendor: int,
        device: int,
        driver: str | None = None,
        pci_class: int = 0x030000,
        subsystem_vendor: int = 0,
        subsystem_device: int = 0,
    ) -> str:
        """A PCI function under `/sys/devices/pci<domain>:<bus>/<bdf>`, linked from `/sys/bus/pci/devices`.

        Returns the device's absolute sysfs path.
        """
        bdf = bdf.lower()
        domain, bus = bdf.split(":")[0], bdf.split(":")[1]
        dev = f"/sys/devices/pci{domain}:{bus}/{bdf}"
        self.write(f"{dev}/vendor", f"0x{vendor:04x}\n")
        self.write(f"{dev}/device", f"0x{device:04x}\n")
        self.write(f"{dev}/class", f"0x{pci_class:06x}\n")
        self.write(f"{dev}/subsystem_vendor", f"0x{subsystem_vendor:04x}\n")
        self.write(f"{dev}/subsystem_device", f"0x{subsystem_device:04x}\n")
        uevent = []
        if driver:
            uevent.append(f"DRIVER={driver}")
            self.mkdir(f"/sys/bus/pci/drivers/{driver}")
            self.symlink(f"{dev}/driver", f"/sys/bus/pci/drivers/{driver}")
        uevent += [
            f"PCI_CLASS={pci_class:X}",
            f"PCI_ID={vendor:04X}:{device:04X}",
            f"PCI_SUBSYS_ID={subsystem_vendor:04X}:{subsystem_device:04X}",
            f"PCI_SLOT_NAME={bdf}",
            f"MODALIAS=pci:v{vendor:08X}d{device:08X}sv{subsystem_vendor:08X}sd{subsystem_device:08X}"
            f"bc{pci_class >> 16:02X}sc{(pci_class >> 8) & 0xFF:02X}i{pci_class & 0xFF:02X}",
        ]
        self.write(f"{dev}/uevent", "\n".join(uevent) + "\n")
        self.symlink(f"/sys/bus/pci/devices/{bdf}", dev)
        return dev

    # --- stand-in tools -------------------------------------------------------------------------
    def standin(self, name: str, script: str) -> Path:
        """An executable `name` among the machine's own tools. `script` is its full text, shebang included."""
        tool = self.bin_dir / name
        tool.write_text(script, encoding="utf-8")
        tool.chmod(0o755)
        return tool


def device_numbers(node: Path) -> tuple[int, int] | None:
    """(major, minor) of a device node, real or stood-in by `FakeMachine.char_device`."""
    try:
        st = node.stat()
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return os.major(st.st_rdev), os.minor(st.st_rdev)
    marker = node.with_name(node.name + ".devnum")
    if marker.exists():
        major, minor = marker.read_text().strip().split(":")
        return int(major), int(minor)
    return None
