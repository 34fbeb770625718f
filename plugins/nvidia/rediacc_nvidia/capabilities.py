"""`NVIDIA_DRIVER_CAPABILITIES` under CDI: it changes nothing, but a container may expect it to.

With CDI the container gets exactly what the generated spec mounts, whatever the variable says. The
gate admits it and logs one line when it asks for a capability whose driver files the machine's
spec does not carry. The check is a heuristic on the spec's text: each capability is "provided" when
a library that only it needs appears in the spec (graphics: the GLX/EGL/Vulkan libraries; video: the
decode/encode libraries; display: the X driver; compat32: 32-bit library dirs; ngx: the NGX
library). compute and utility are what every generated spec carries, so they are never reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rediacc_core import Machine

VARIABLE = "NVIDIA_DRIVER_CAPABILITIES"
ALL_CAPABILITIES = ("compute", "compat32", "graphics", "utility", "video", "display", "ngx")
ALWAYS_PROVIDED = frozenset({"compute", "utility"})
SPEC = "/etc/cdi/nvidia.yaml"

MARKERS: Mapping[str, tuple[str, ...]] = {
    "graphics": ("libGLX_nvidia", "libEGL_nvidia", "libnvidia-glcore", "nvidia_icd.json"),
    "video": ("libnvcuvid", "libnvidia-encode", "libnvidia-opticalflow"),
    "display": ("nvidia_drv.so", "libglxserver_nvidia", "libnvidia-fbc"),
    "compat32": ("/lib32/", "i386-linux-gnu", "/lib/i386"),
    "ngx": ("libnvidia-ngx", "nvngx"),
}

# The spec is read on the gate's decision path: keep its text until the file changes.
_cache: dict[Path, tuple[tuple[int, int], str]] = {}


def _spec_text(path: Path) -> str | None:
    try:
        st = path.stat()
        key = (st.st_mtime_ns, st.st_size)
        cached = _cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    _cache[path] = (key, text)
    return text


def requested(value: str) -> list[str]:
    parts = [part.strip().lower() for part in value.split(",") if part.strip()]
    return list(ALL_CAPABILITIES) if "all" in parts else parts


def missing_capabilities(value: str, spec_text: str) -> list[str]:
    return [
        cap
        for cap in requested(value)
        if cap not in ALWAYS_PROVIDED and not any(marker in spec_text for marker in MARKERS.get(cap, ()))
    ]


def capability_note(env: Mapping[str, str], machine: Machine) -> str | None:
    """A log line when the container asks for capabilities the spec does not carry; else None."""
    value = env.get(VARIABLE)
    if not value:
        return None
    if not [cap for cap in requested(value) if cap not in ALWAYS_PROVIDED]:
        return None
    text = _spec_text(machine.path(SPEC))
    if text is None:
        return f"nvidia: {VARIABLE}={value} is admitted; the machine's {SPEC} could not be read to compare"
    missing = missing_capabilities(value, text)
    if not missing:
        return None
    return (
        f"nvidia: {VARIABLE}={value} has no effect under CDI; the machine's spec carries no driver files "
        f"for {', '.join(missing)}, so the container will not have them"
    )
