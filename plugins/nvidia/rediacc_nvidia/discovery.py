"""Which way to look for NVIDIA GPUs on a machine, and the fallbacks between them.

Native machines: NVML when the machine is this host and the library loads (fast and complete);
otherwise `nvidia-smi` from PATH; otherwise what the kernel module shows under /proc. WSL2 machines
(the Windows GPU device `/dev/dxg`): the `nvidia-smi` the Windows driver maps into
`/usr/lib/wsl/lib`, since there is no kernel module or /proc entry inside the VM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rediacc_core import Gpu, Machine, ToolError
from rediacc_nvidia.discovery_nvml import discover_nvml, load_nvml
from rediacc_nvidia.discovery_proc import PROC_DIR, discover_proc
from rediacc_nvidia.discovery_smi import (
    QUERY_FIELDS,
    SmiParseError,
    combine,
    parse_list,
    parse_query_csv,
    parse_xml,
)

WSL_LIB_DIR = "/usr/lib/wsl/lib"
_TIMEOUT = 120.0  # nvidia-smi can take tens of seconds on a large machine without persistence mode


def is_wsl(machine: Machine) -> bool:
    # The same test the core uses for the inventory's platform, so the two never disagree.
    return machine.platform == "wsl"


def platform_of(machine: Machine) -> str:
    return "wsl" if is_wsl(machine) else "native"


def find_smi(machine: Machine) -> str | None:
    """The nvidia-smi to run: WSL's own copy first, then PATH."""
    if is_wsl(machine):
        wsl_smi = machine.path(f"{WSL_LIB_DIR}/nvidia-smi")
        if wsl_smi.is_file():
            return str(wsl_smi)
    return machine.which("nvidia-smi")


def _tool_error(machine: str, argv: list[str], returncode: int, output: str) -> ToolError:
    detail = output.strip().splitlines()[-1] if output.strip() else "no output"
    return ToolError(
        f"`{' '.join(argv)}` failed (exit {returncode}): {detail}",
        "check the NVIDIA driver on the machine (does `nvidia-smi` work there?), "
        f"then run `rdc machine setup {machine}` again",
    )


def discover_smi(machine: Machine, smi: str, platform: str) -> list[Gpu]:
    """GPUs from nvidia-smi: `-q -x` for the GPUs, `--query-gpu` and `-L` to complete them."""
    argv = [smi, "-q", "-x"]
    result = machine.run(argv, timeout=_TIMEOUT)
    if not result.ok:
        raise _tool_error(machine.name, argv, result.returncode, result.stderr or result.stdout)
    try:
        report = parse_xml(result.stdout)
    except SmiParseError as exc:
        raise ToolError(str(exc), "run `nvidia-smi -q -x` on the machine to see what it prints") from exc

    rows: list[dict[str, str | None]] = []
    query = machine.run([smi, f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv"], timeout=_TIMEOUT)
    if query.ok:  # drivers before ~510 reject compute_cap; the XML still has everything else
        try:
            rows = parse_query_csv(query.stdout)
        except SmiParseError:
            rows = []

    has_mig = any(gpu.migs or gpu.mig_mode == "Enabled" for gpu in report.gpus)
    listing = machine.run([smi, "-L"], timeout=_TIMEOUT)
    listed = []
    if listing.ok:
        try:
            listed = parse_list(listing.stdout)
        except SmiParseError as exc:
            if has_mig:  # MIG UUIDs and profiles exist nowhere else
                raise ToolError(str(exc), "run `nvidia-smi -L` on the machine to see what it prints") from exc
    elif has_mig:
        raise _tool_error(machine.name, [smi, "-L"], listing.returncode, listing.stderr or listing.stdout)
    return combine(report, rows, listed, platform)


def discover(machine: Machine, nvml_loader: Callable[[], Any | None] = load_nvml) -> list[Gpu]:
    """Every NVIDIA GPU on `machine`; `[]` when there is none or no driver is loaded."""
    platform = platform_of(machine)
    if platform == "native" and machine.is_host:
        nvml = nvml_loader()
        if nvml is not None:
            return discover_nvml(nvml, platform)
    smi = find_smi(machine)
    if smi is None:
        return discover_proc(machine, platform) if platform == "native" else []
    try:
        return discover_smi(machine, smi, platform)
    except ToolError:
        if platform == "wsl":
            raise
        fallback = discover_proc(machine, platform)
        if fallback:
            return fallback
        if not machine.path(PROC_DIR).exists():
            # nvidia-smi installed but no kernel module loaded: no GPU is usable, which is not an error.
            return []
        raise
