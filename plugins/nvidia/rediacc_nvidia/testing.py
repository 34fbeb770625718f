"""Fake NVIDIA machines for tests: the kernel's files, device nodes, and stand-in vendor tools.

For this repository's tests and for third-party plugin authors. A layout starts from a real
`nvidia-smi -q -x` capture (the caller reads it, e.g. from a `realdata` directory) and builds what a
machine with those GPUs shows: `/dev/nvidia<minor>`, `/dev/nvidiactl`, `/proc/driver/nvidia`, the
driver's libraries, and stand-ins for `nvidia-smi` and `nvidia-ctk` in the machine's bin directory.

The stand-ins are tiny scripts that call back into this module with the data directory they serve
(`<bin>/nvidia-smi.d/`): `nvidia-smi` prints the capture files placed there (`-q -x`, `-L`,
`--query-gpu`), and `nvidia-ctk cdi generate` writes a CDI spec shaped like the real toolkit's, whose
`hostPath`s lie under the machine root. The root comes from `--dev-root`, else `$REDIACC_FAKE_ROOT`,
else the root the layout was built for.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rediacc_core.testing import FakeMachine, device_numbers, real_capture
from rediacc_nvidia.discovery_smi import XmlReport, parse_list, parse_query_csv, parse_xml

DATA_DIR = "nvidia-smi.d"
ROOT_ENV = "REDIACC_FAKE_ROOT"
CTK_VERSION = "1.18.0"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"

# Character-device majors as a Linux host shows them: 195 is registered to the NVIDIA driver; the
# UVM and caps majors are dynamic, these are typical values.
NVIDIA_MAJOR = 195
UVM_MAJOR = 235
CAPS_MAJOR = 236

NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


# Two data-centre GPUs in the shape `nvidia-smi -q -x` prints, only what discovery reads: for suites
# that change the cards between steps (a swap, a reorder) and so cannot start from one capture.
_A100 = """  <gpu id="{bus}">
    <product_name>NVIDIA A100-SXM4-40GB</product_name>
    <product_brand>NVIDIA</product_brand>
    <product_architecture>Ampere</product_architecture>
    <mig_mode><current_mig>Disabled</current_mig><pending_mig>Disabled</pending_mig></mig_mode>
    <uuid>{uuid}</uuid>
    <minor_number>{minor}</minor_number>
    <pci><pci_bus_id>{bus}</pci_bus_id></pci>
    <fb_memory_usage><total>40960 MiB</total><used>0 MiB</used><free>40536 MiB</free></fb_memory_usage>
  </gpu>
"""
A100_UUIDS = ("GPU-5e2c1a0b-7d4f-4c11-9a3e-0b1c2d3e4f50", "GPU-9d8c7b6a-1e2f-4a3b-8c4d-5e6f708192a3")


def two_a100s(first: str = A100_UUIDS[0], second: str = A100_UUIDS[1]) -> str:
    """`nvidia-smi -q -x` of two A100s with these UUIDs, at index 0 (bus 07) and 1 (bus 0F); pass it
    to `nvidia_machine` with `compute_caps=("8.0", "8.0")`."""
    return (
        '<?xml version="1.0" ?>\n<nvidia_smi_log>\n  <driver_version>535.104.05</driver_version>\n'
        "  <cuda_version>12.2</cuda_version>\n  <attached_gpus>2</attached_gpus>\n"
        + _A100.format(bus="00000000:07:00.0", uuid=first, minor=0)
        + _A100.format(bus="00000000:0F:00.0", uuid=second, minor=1)
        + "</nvidia_smi_log>\n"
    )


def data_dir(fm: FakeMachine) -> Path:
    return fm.bin_dir / DATA_DIR


def _script(call: str, data: Path) -> str:
    return f"#!{sys.executable}\nfrom rediacc_nvidia import testing\ntesting.{call}({str(data)!r})\n"


# --- what the stand-in nvidia-smi serves, derived in the real output's shape ------------------------


def list_text(report: XmlReport, mig_profiles: Mapping[int, Sequence[str]] | None = None) -> str:
    """`nvidia-smi -L` for the GPUs of a report, with MIG lines (masked UUIDs) for its MIG devices."""
    lines = []
    counter = 0
    for gpu in report.gpus:
        lines.append(f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})")
        profiles = list((mig_profiles or {}).get(gpu.index, ()))
        for mig in gpu.migs:
            profile = profiles[mig.index] if mig.index < len(profiles) else "1g.10gb"
            uuid = f"MIG-{counter:08d}-0000-0000-0000-{counter:012d}"
            counter += 1
            lines.append(f"  MIG {profile:<11} Device {mig.index:>2}: (UUID: {uuid})")
    return "\n".join(lines) + "\n"


def query_csv(report: XmlReport, compute_caps: Sequence[str]) -> str:
    """A `--query-gpu` CSV (every field the stand-in can answer) for the GPUs of a report."""
    header = (
        "index, name, uuid, pci.bus_id, driver_version, memory.total [MiB], compute_cap, mig.mode.current"
    )
    rows = [header]
    for gpu, cap in zip(report.gpus, compute_caps, strict=True):
        bus = f"0000{gpu.pci_bus_id}".upper() if gpu.pci_bus_id else "[N/A]"
        memory = f"{gpu.memory_mib} MiB" if gpu.memory_mib is not None else "[N/A]"
        rows.append(
            f"{gpu.index}, {gpu.name}, {gpu.uuid}, {bus}, {report.driver_version}, {memory}, {cap}, "
            f"{gpu.mig_mode or '[N/A]'}"
        )
    return "\n".join(rows) + "\n"


# --- layouts --------------------------------------------------------------------------------------


def nvidia_machine(
    fm: FakeMachine,
    xml: str,
    *,
    list_output: str | None = None,
    query_output: str | None = None,
    compute_caps: Sequence[str] | None = None,
    mig_profiles: Mapping[int, Sequence[str]] | None = None,
    toolkit: bool = True,
    persistenced: bool = False,
    driver_loaded: bool = True,
) -> XmlReport:
    """A native machine with the GPUs of the `nvidia-smi -q -x` capture `xml`.

    `compute_caps` (one per GPU) make `--query-gpu` answer `compute_cap`; without them (and without a
    `query_output` capture) the stand-in rejects that field the way drivers before 510 did.
    `toolkit=False` leaves `nvidia-ctk` out, as before the toolkit is installed. `driver_loaded=False`
    makes nvidia-smi fail the way it does when the kernel module is not loaded.
    """
    report = parse_xml(xml)
    data = data_dir(fm)
    data.mkdir(parents=True, exist_ok=True)
    (data / "q-x.xml").write_text(xml, encoding="utf-8")
    (data / "L.txt").write_text(list_output or list_text(report, mig_profiles), encoding="utf-8")
    if query_output is not None:
        (data / "query.csv").write_text(query_output, encoding="utf-8")
    elif compute_caps is not None:
        (data / "query.csv").write_text(query_csv(report, compute_caps), encoding="utf-8")
    (data / "root").write_text(str(fm.root), encoding="utf-8")
    if not driver_loaded:
        (data / "fail").write_text(f"9\n{NOT_LOADED}\n", encoding="utf-8")
    fm.standin("nvidia-smi", _script("smi_main", data))
    fm.standin("nvidia-cdi-hook", "#!/bin/sh\nexit 0\n")
    if toolkit:
        install_ctk(fm)
    if not driver_loaded:
        return report

    version = report.driver_version or "0"
    fm.write(
        "/proc/driver/nvidia/version",
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Tue Jun  6 22:20:39 UTC 2023\n"
        "GCC version:  gcc version 11.3.0 (Ubuntu 11.3.0-1ubuntu1~22.04.1)\n",
    )
    fm.char_device("/dev/nvidiactl", NVIDIA_MAJOR, 255)
    fm.char_device("/dev/nvidia-modeset", NVIDIA_MAJOR, 254)
    fm.char_device("/dev/nvidia-uvm", UVM_MAJOR, 0)
    fm.char_device("/dev/nvidia-uvm-tools", UVM_MAJOR, 1)
    cap_minor = 1
    for gpu in report.gpus:
        minor = gpu.minor if gpu.minor is not None else gpu.index
        fm.char_device(f"/dev/nvidia{minor}", NVIDIA_MAJOR, minor)
        bus = gpu.pci_bus_id or f"0000:{gpu.index:02x}:00.0"
        fm.write(
            f"/proc/driver/nvidia/gpus/{bus}/information",
            f"Model: \t\t {gpu.name}\nIRQ:   \t\t 145\nGPU UUID: \t {gpu.uuid}\n"
            f"Video BIOS: \t 92.00.36.00.10\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
            f"DMA Mask: \t 0x7fffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
            "GPU Excluded:\t No\n",
        )
        for _mig in gpu.migs:
            fm.char_device(f"/dev/nvidia-caps/nvidia-cap{cap_minor}", CAPS_MAJOR, cap_minor)
            fm.char_device(f"/dev/nvidia-caps/nvidia-cap{cap_minor + 1}", CAPS_MAJOR, cap_minor + 1)
            cap_minor += 2
    for lib in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"):
        fm.write(f"{LIB_DIR}/{lib}.{version}", "placeholder for a driver library\n")
    if persistenced:
        fm.write("/run/nvidia-persistenced/socket", "")
    return report


def wsl_machine(
    fm: FakeMachine, xml: str, *, compute_caps: Sequence[str] | None = None, toolkit: bool = True
) -> XmlReport:
    """A WSL2 machine: `/dev/dxg`, the Windows driver's files in /usr/lib/wsl/lib, no /proc entries."""
    report = parse_xml(xml)
    data = data_dir(fm)
    data.mkdir(parents=True, exist_ok=True)
    (data / "q-x.xml").write_text(xml, encoding="utf-8")
    (data / "L.txt").write_text(list_text(report), encoding="utf-8")
    if compute_caps is not None:
        (data / "query.csv").write_text(query_csv(report, compute_caps), encoding="utf-8")
    (data / "root").write_text(str(fm.root), encoding="utf-8")
    fm.char_device("/dev/dxg", 10, 125)
    smi = fm.write("/usr/lib/wsl/lib/nvidia-smi", _script("smi_main", data), mode=0o755)
    smi.chmod(0o755)
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1", "libdxcore.so"):
        fm.write(f"/usr/lib/wsl/lib/{lib}", "placeholder for a WSL driver library\n")
    fm.standin("nvidia-cdi-hook", "#!/bin/sh\nexit 0\n")
    if toolkit:
        install_ctk(fm)
    return report


def install_ctk(fm: FakeMachine) -> Path:
    """Put the stand-in `nvidia-ctk` on the machine's PATH (what installing the toolkit does)."""
    data = data_dir(fm)
    data.mkdir(parents=True, exist_ok=True)
    (data / "root").write_text(str(fm.root), encoding="utf-8")
    return fm.standin("nvidia-ctk", _script("ctk_main", data))


def break_ctk(fm: FakeMachine, how: str = "fail") -> None:
    """Make the stand-in `nvidia-ctk cdi generate` fail (`fail`) or write an invalid spec (`invalid`)."""
    (data_dir(fm) / f"ctk-{how}").write_text("", encoding="utf-8")


def package_manager(fm: FakeMachine, kind: str = "apt") -> Path:
    """Stand-ins for `apt-get` or `dnf`/`yum`, and `curl`, that log every call and need nothing on PATH.

    Installing `nvidia-container-toolkit` puts the stand-in `nvidia-ctk` on PATH, as the real package
    does. Returns the log file (one call per line: the tool's name and its arguments).
    """
    data = data_dir(fm)
    data.mkdir(parents=True, exist_ok=True)
    (data / "root").write_text(str(fm.root), encoding="utf-8")
    log = fm.bin_dir / "calls.log"
    log.touch()
    for tool in ("curl", "apt-get" if kind == "apt" else kind):
        fm.standin(tool, _script("package_tool_main", data))
    return log


_KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBFakeKeyForTests\n-----END PGP PUBLIC KEY BLOCK-----\n"
_REPO = (
    "[nvidia-container-toolkit]\nname=nvidia-container-toolkit\n"
    "baseurl=https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch\n"
    "repo_gpgcheck=1\ngpgcheck=0\nenabled=1\ngpgkey=https://nvidia.github.io/libnvidia-container/gpgkey\n"
)


def package_tool_main(data: str) -> None:
    """The stand-in curl / apt-get / dnf / yum."""
    folder = Path(data)
    tool, args = Path(sys.argv[0]).name, sys.argv[1:]
    with (folder.parent / "calls.log").open("a", encoding="utf-8") as log:
        log.write(" ".join([tool, *args]) + "\n")
    if tool == "curl":
        sys.stdout.write(_KEY if args[-1].endswith("/gpgkey") else _REPO)
        return
    if "install" in args and "nvidia-container-toolkit" in args:
        ctk = folder.parent / "nvidia-ctk"
        ctk.write_text(_script("ctk_main", folder), encoding="utf-8")
        ctk.chmod(0o755)


# --- the stand-in tools themselves ----------------------------------------------------------------


def smi_main(data: str) -> None:
    """The stand-in `nvidia-smi`: serves the files of its data directory like the real tool."""
    args = sys.argv[1:]
    folder = Path(data)
    fail = folder / "fail"
    if fail.exists():
        code, _, message = fail.read_text(encoding="utf-8").partition("\n")
        sys.stdout.write(message)
        raise SystemExit(int(code))
    if set(args) in ({"-q", "-x"}, {"--query", "--xml-format"}):
        sys.stdout.write((folder / "q-x.xml").read_text(encoding="utf-8"))
        return
    if args in (["-L"], ["--list-gpus"]):
        sys.stdout.write((folder / "L.txt").read_text(encoding="utf-8"))
        return
    query = [arg for arg in args if arg.startswith("--query-gpu=")]
    if query:
        fields = query[0].split("=", 1)[1].split(",")
        formats = next(
            (arg.split("=", 1)[1].split(",") for arg in args if arg.startswith("--format=")), ["csv"]
        )
        raise SystemExit(_answer_query(folder / "query.csv", fields, formats))
    sys.stderr.write(f"stand-in nvidia-smi: unsupported arguments {args}\n")
    raise SystemExit(2)


def _answer_query(source: Path, fields: list[str], formats: list[str]) -> int:
    rows = parse_query_csv(source.read_text(encoding="utf-8")) if source.exists() else []
    header_line = source.read_text(encoding="utf-8").splitlines()[0] if source.exists() else ""
    headers = {cell.strip().split(" [")[0]: cell.strip() for cell in header_line.split(",")}
    for name in fields:
        if name not in headers:
            # What drivers print for a field they do not know (compute_cap before ~510).
            sys.stdout.write(f'Field "{name}" is not a valid field to query.\n\n')
            return 2
    out = io.StringIO()
    if "noheader" not in formats:
        out.write(", ".join(headers[name] for name in fields) + "\n")
    for row in rows:
        values = []
        for name in fields:
            value = row.get(name)
            text = "[N/A]" if value is None else value
            if "nounits" in formats and value is not None:
                text = text.split(" ")[0] if text[:1].isdigit() else text
            values.append(text)
        out.write(", ".join(values) + "\n")
    sys.stdout.write(out.getvalue())
    return 0


def _option(args: Sequence[str], name: str) -> str | None:
    for position, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and position + 1 < len(args):
            return args[position + 1]
    return None


def ctk_main(data: str) -> None:
    """The stand-in `nvidia-ctk`: `--version`, `cdi generate` and `system create-dev-char-symlinks`."""
    args = sys.argv[1:]
    folder = Path(data)
    if args[:1] in (["--version"], ["-v"]):
        sys.stdout.write(f"NVIDIA Container Toolkit CLI version {CTK_VERSION}\ncommit: standin\n")
        return
    if args[:2] == ["system", "create-dev-char-symlinks"]:
        _dev_char_links(folder, args)
        return
    if args[:2] != ["cdi", "generate"]:
        sys.stderr.write(f"stand-in nvidia-ctk: unsupported arguments {args}\n")
        raise SystemExit(2)
    if (folder / "ctk-fail").exists():
        sys.stderr.write(
            'level=error msg="failed to generate CDI spec: failed to initialize NVML: Driver Not Loaded"\n'
        )
        raise SystemExit(1)
    root = Path(
        _option(args, "--dev-root")
        or os.environ.get(ROOT_ENV)
        or (folder / "root").read_text(encoding="utf-8").strip()
    )
    mode = _option(args, "--mode") or "auto"
    spec = generate_spec(folder, root, wsl=mode == "wsl")
    if (folder / "ctk-invalid").exists():
        spec["devices"][0]["containerEdits"] = {}
    output = _option(args, "--output")
    fmt = _option(args, "--format") or ("json" if output and output.endswith(".json") else "yaml")
    text = json.dumps(spec, indent=2) if fmt == "json" else yaml.safe_dump(spec, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
        return
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(text, encoding="utf-8")
    sys.stderr.write('level=info msg="Generated CDI spec with version 0.5.0"\n')


def _dev_char_links(folder: Path, args: Sequence[str]) -> None:
    """`system create-dev-char-symlinks`: a `MAJOR:MINOR` link per NVIDIA node, an existing link left
    as it is (the real tool warns and goes on); each call is logged to `dev-char.log`."""
    with (folder / "dev-char.log").open("a", encoding="utf-8") as log:
        log.write(" ".join(args) + "\n")
    root = Path(_option(args, "--driver-root") or "/")
    char = Path(_option(args, "--dev-char-path") or "/dev/char")
    char.mkdir(parents=True, exist_ok=True)
    dev = root / "dev"
    for node in sorted([*dev.glob("nvidia*"), *dev.glob("nvidia-caps/nvidia-cap*")]):
        numbers = device_numbers(node)
        link = char / f"{numbers[0]}:{numbers[1]}" if numbers else None
        if link is not None and not link.is_symlink():
            link.symlink_to(f"/dev/{node.relative_to(dev)}")


def dev_char_calls(fm: FakeMachine) -> list[str]:
    """The stand-in `nvidia-ctk system create-dev-char-symlinks` calls made so far."""
    log = data_dir(fm) / "dev-char.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def _node(root: Path, path: str) -> dict[str, str]:
    return {"path": path, "hostPath": str(root / path.lstrip("/"))}


def _wsl_spec(root: Path, hook: str) -> dict[str, Any]:
    """Under WSL the GPU is one paravirtual device, /dev/dxg, and the driver's libraries come from
    Windows (/usr/lib/wsl/lib)."""
    libs = sorted(p.name for p in (root / "usr/lib/wsl/lib").iterdir() if p.is_file())
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "all", "containerEdits": {"deviceNodes": [_node(root, "/dev/dxg")]}}],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": hook,
                    "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/wsl/lib"],
                }
            ],
            "mounts": [
                {
                    "hostPath": str(root / "usr/lib/wsl/lib" / lib),
                    "containerPath": f"/usr/lib/wsl/lib/{lib}",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
                for lib in libs
            ],
        },
    }


def _devices(report: XmlReport, listed_text: str, root: Path) -> list[dict[str, Any]]:
    """The spec's devices: each GPU by index and UUID, each MIG device by `gpu:mig` and UUID (the
    UUIDs `nvidia-smi -L` lists), and `all`."""
    listed = {gpu.index: gpu for gpu in parse_list(listed_text)}
    devices: list[dict[str, Any]] = []
    every_node: list[dict[str, str]] = []
    cap_minor = 1
    for gpu in report.gpus:
        minor = gpu.minor if gpu.minor is not None else gpu.index
        node = _node(root, f"/dev/nvidia{minor}")
        every_node.append(node)
        devices.append({"name": str(gpu.index), "containerEdits": {"deviceNodes": [node]}})
        if gpu.uuid:
            devices.append({"name": gpu.uuid, "containerEdits": {"deviceNodes": [node]}})
        listed_migs = {mig.index: mig for mig in listed[gpu.index].migs} if gpu.index in listed else {}
        for mig in gpu.migs:
            caps = [
                _node(root, f"/dev/nvidia-caps/nvidia-cap{cap_minor}"),
                _node(root, f"/dev/nvidia-caps/nvidia-cap{cap_minor + 1}"),
            ]
            cap_minor += 2
            edits = {"deviceNodes": [node, *caps]}
            devices.append({"name": f"{gpu.index}:{mig.index}", "containerEdits": edits})
            if mig.index in listed_migs:
                devices.append({"name": listed_migs[mig.index].uuid, "containerEdits": edits})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every_node}})
    return devices


def generate_spec(folder: Path, root: Path, *, wsl: bool = False) -> dict[str, Any]:
    """A CDI spec shaped like `nvidia-ctk cdi generate` output for the GPUs this data directory serves."""
    hook = str(folder.parent / "nvidia-cdi-hook")
    report = parse_xml((folder / "q-x.xml").read_text(encoding="utf-8"))
    if wsl:
        return _wsl_spec(root, hook)
    devices = _devices(report, (folder / "L.txt").read_text(encoding="utf-8"), root)
    version = report.driver_version or "0"
    mounts = [
        {
            "hostPath": str(root / LIB_DIR.lstrip("/") / f"{lib}.{version}"),
            "containerPath": f"{LIB_DIR}/{lib}.{version}",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
        for lib in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so")
        if (root / LIB_DIR.lstrip("/") / f"{lib}.{version}").exists()
    ]
    if (root / "run/nvidia-persistenced/socket").exists():
        mounts.append(
            {
                "hostPath": str(root / "run/nvidia-persistenced/socket"),
                "containerPath": "/run/nvidia-persistenced/socket",
                "options": ["ro", "nosuid", "nodev", "bind", "noexec"],
            }
        )
    spec_nodes = [
        _node(root, path)
        for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
        if (root / path.lstrip("/")).exists()
    ]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": spec_nodes,
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": hook,
                    "args": [
                        "nvidia-cdi-hook",
                        "create-symlinks",
                        "--link",
                        f"libcuda.so.{version}::{LIB_DIR}/libcuda.so.1",
                    ],
                },
                {
                    "hookName": "createContainer",
                    "path": hook,
                    "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIB_DIR],
                },
            ],
            "mounts": mounts,
        },
    }


def read_capture(relative: str, realdata: Path | None = None) -> str:
    """A real capture's text by its path under the realdata directory (`$REDIACC_REALDATA`; the test
    skips when the captures are not here)."""
    path = realdata / relative if realdata is not None else real_capture(relative)
    return path.read_text(encoding="utf-8")


# Ready-made machines from the real captures: (capture, compute capability per GPU, MIG profiles).
LAYOUTS: Mapping[str, tuple[str, tuple[str, ...] | None, Mapping[int, Sequence[str]] | None]] = {
    "a100-mig": ("nvidia-smi-q-x/a100-sxm4-40gb-mig_510.47.03.xml", ("8.0",), {0: ("3g.20gb", "3g.20gb")}),
    "a5000-x2": ("nvidia-smi-q-x/rtx-a5000-x2_590.44.01.xml", ("8.6", "8.6"), None),
    "t4": ("nvidia-smi-q-x/tesla-t4_515.105.01.xml", ("7.5",), None),
    "p400-418": ("nvidia-smi-q-x/quadro-p400_418.43.xml", None, None),  # too old for compute_cap
    "wsl-rtx3080": ("nvidia-smi-q-x/rtx-3080-windows_536.40.xml", ("8.6",), None),
}


def layout(fm: FakeMachine, name: str, **options: Any) -> XmlReport:
    """One of `LAYOUTS` on `fm` (`wsl-*` ones as WSL machines); `options` go to `nvidia_machine`."""
    relative, caps, profiles = LAYOUTS[name]
    xml = read_capture(relative)
    if name.startswith("wsl-"):
        return wsl_machine(fm, xml, compute_caps=caps, **options)
    return nvidia_machine(fm, xml, compute_caps=caps, mig_profiles=profiles, **options)


class NvmlNotSupported(Exception):
    """What the stand-in raises where NVML answers NVML_ERROR_NOT_SUPPORTED."""


def nvml_from_captures(xml: str, query_output: str) -> Any:
    """A stand-in `pynvml`, initialised, that reports the GPUs of real `nvidia-smi` captures in
    NVML's own shapes: enum numbers for brand and architecture, bytes of memory, the CUDA version as
    an integer, the 8-digit bus id as bytes, the compute capability as a (major, minor) pair. So the
    NVML path and the nvidia-smi path can be held to the same facts of one real card. MIG devices
    are not modelled: NVML reports MIG mode Disabled for every GPU here."""
    from types import SimpleNamespace

    from rediacc_nvidia.discovery_nvml import ARCHITECTURES, BRANDS

    report = parse_xml(xml)
    caps = {row["uuid"]: row["compute_cap"] for row in parse_query_csv(query_output)}

    def code(table: Mapping[int, str], word: str | None) -> int | None:
        return next((number for number, name in table.items() if name == word), None)

    def gpu(handle: int) -> Any:
        return report.gpus[handle]

    def optional(value: Any) -> Any:
        if value is None:
            raise NvmlNotSupported()
        return value

    def capability(handle: int) -> tuple[int, int]:
        major, minor = str(optional(caps.get(gpu(handle).uuid))).split(".")
        return int(major), int(minor)

    def mig_mode(handle: int) -> list[int]:
        if gpu(handle).mig_mode is None:
            raise NvmlNotSupported()
        return [0, 0]

    major, _, minor = (report.cuda_version or "0.0").partition(".")
    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: report.driver_version,
        nvmlSystemGetCudaDriverVersion=lambda: int(major) * 1000 + int(minor or 0) * 10,
        nvmlDeviceGetCount=lambda: len(report.gpus),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=lambda handle: gpu(handle).name.encode(),
        nvmlDeviceGetUUID=lambda handle: optional(gpu(handle).uuid).encode(),
        nvmlDeviceGetPciInfo=lambda handle: SimpleNamespace(
            busId=("0000" + optional(gpu(handle).pci_bus_id).upper()).encode()
        ),
        nvmlDeviceGetMemoryInfo=lambda handle: SimpleNamespace(
            total=optional(gpu(handle).memory_mib) * 2**20
        ),
        nvmlDeviceGetCudaComputeCapability=capability,
        nvmlDeviceGetBrand=lambda handle: optional(code(BRANDS, gpu(handle).brand)),
        nvmlDeviceGetArchitecture=lambda handle: optional(code(ARCHITECTURES, gpu(handle).architecture)),
        nvmlDeviceGetMinorNumber=lambda handle: optional(gpu(handle).minor),
        nvmlDeviceGetMigMode=mig_mode,
    )


__all__ = [
    "break_ctk",
    "generate_spec",
    "install_ctk",
    "layout",
    "list_text",
    "nvidia_machine",
    "nvml_from_captures",
    "package_manager",
    "query_csv",
    "read_capture",
    "wsl_machine",
]
