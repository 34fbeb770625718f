"""Builds bench/loadgen.c at run time and runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("loadgen.c")


def build(into: Path) -> Path:
    """Compiles the load generator with the system C compiler (`cc -O2`) into `into`."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError(
            "no C compiler: install one (Debian: apt-get install gcc) to build bench/loadgen.c"
        )
    binary = into / "loadgen"
    result = subprocess.run(
        [compiler, "-O2", "-Wall", "-o", str(binary), str(SOURCE)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"bench/loadgen.c did not compile:\n{result.stderr}")
    return binary


def run(
    binary: Path,
    sock: str,
    path: str,
    *,
    conns: int = 8,
    duration_s: float = 5.0,
    warmup_s: float = 0.5,
    requests: int = 0,
    method: str = "GET",
    body_file: Path | None = None,
    headers: tuple[str, ...] = (),
) -> dict[str, Any]:
    argv = [str(binary), "-s", sock, "-c", str(conns), "-d", str(duration_s), "-w", str(warmup_s)]
    argv += ["-m", method, "-p", path]
    if requests:
        argv += ["-n", str(requests)]
    if body_file is not None:
        argv += ["-b", str(body_file)]
    for header in headers:
        argv += ["-H", header]
    hard_limit = warmup_s + duration_s + 15
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=hard_limit + 5)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"loadgen on {sock} {path} did not finish within {hard_limit + 5:.0f}s") from None
    if result.returncode != 0:
        raise RuntimeError(f"loadgen on {sock} {path} failed ({result.returncode}): {result.stderr.strip()}")
    data: dict[str, Any] = json.loads(result.stdout)
    return data
