"""`rdc machine install`: the client's own rediacc-core and plugin versions, as wheels, in a venv there.

Wheels are made here from what this client runs (a source checkout is built with `pip wheel`, an
installed wheel is packed again from its RECORD), so the machine gets exactly these versions; pip on
the machine fetches their dependencies as usual. The venv is /opt/rediacc under the machine's root.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from rediacc_core.errors import ToolError
from rediacc_core.remote.ssh import CONNECT_TIMEOUT, SshMachine, classify, stderr_file

PIP_TIMEOUT = 600
RECORD = "installed.json"  # beside the venv: what `fingerprints` said of the wheels installed
UNKNOWN = "unknown"
# Never part of a wheel, and slow or large to read.
_SKIPPED = {"__pycache__", "build", "dist", "node_modules"}


def fingerprints(names: list[str]) -> dict[str, str]:
    """A digest of what each distribution's wheel would hold, without building it: a checkout's
    files, or an installed wheel's RECORD. Equal digests on both sides: nothing to install."""
    found = {}
    for name in names:
        dist = metadata.distribution(name)
        source = _source_dir(dist)
        digest = hashlib.sha256()
        record = dist.read_text("RECORD")
        if source is None and record is None:
            found[name] = UNKNOWN  # nothing to tell this copy by: always installed
            continue
        if source is None:
            digest.update(str(record).encode())
        else:
            for path in _source_files(source):
                digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes() + b"\0")
        found[name] = f"{dist.version} sha256:{digest.hexdigest()}"
    return found


def _source_files(top: Path) -> list[Path]:
    files = []
    for here, dirs, names in os.walk(top):
        keep = [
            d for d in dirs if not d.startswith(".") and d not in _SKIPPED and not d.endswith(".egg-info")
        ]
        dirs[:] = sorted(d for d in keep if not (Path(here) / d / "pyvenv.cfg").exists())
        files += [
            Path(here) / n for n in sorted(names) if not n.endswith((".pyc", ".so")) and not n.startswith(".")
        ]
    return files


def build_wheels(names: list[str], into: Path) -> list[Path]:
    """A wheel for each installed distribution in `names`."""
    wheels = []
    for name in names:
        dist = metadata.distribution(name)
        source = _source_dir(dist)
        wheels.append(_pip_wheel(name, source, into) if source is not None else _repack(dist, into))
    return wheels


def _source_dir(dist: metadata.Distribution) -> Path | None:
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    info = json.loads(text)
    url = str(info.get("url", ""))
    if "dir_info" in info and url.startswith("file://"):
        return Path(url.removeprefix("file://"))
    return None


def _pip_wheel(name: str, source: Path, into: Path) -> Path:
    """`pip wheel` of a source checkout: with this environment's build backend when it has one,
    else in pip's isolated build environment (which fetches the backend from the index)."""
    base = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(into)]
    errors = ""
    for extra in (["--no-build-isolation"], []):
        before = set(into.glob("*.whl"))
        proc = subprocess.run(
            [*base, *extra, str(source)], capture_output=True, text=True, timeout=PIP_TIMEOUT
        )
        made = set(into.glob("*.whl")) - before
        if proc.returncode == 0 and len(made) == 1:
            return made.pop()
        errors = proc.stderr.strip()
    raise ToolError(
        f"could not build a wheel of {name} from {source}: {errors[-500:]}",
        f"check that `pip wheel --no-deps {source}` works here",
    )


def _repack(dist: metadata.Distribution, into: Path) -> Path:
    """The wheel an installed distribution came from, rebuilt from the files its RECORD lists."""
    wheel_text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")]
    name = dist.metadata["Name"].replace("-", "_")
    target = into / f"{name}-{dist.version}-{tags[0] if tags else 'py3-none-any'}.whl"
    files = [f for f in dist.files or [] if not str(f).startswith("..") and not str(f).endswith(".pyc")]
    info_dir = f"{name}-{dist.version}.dist-info"
    records: list[list[str]] = []
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for entry in files:
            path = str(entry)
            if (
                path.endswith(".dist-info/RECORD")
                or path.endswith("INSTALLER")
                or path.endswith("direct_url.json")
            ):
                continue
            data = Path(str(entry.locate())).read_bytes()
            archive.writestr(path if ".dist-info/" not in path else f"{info_dir}/{Path(path).name}", data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append([path, f"sha256={digest}", str(len(data))])
        out = io.StringIO()
        csv.writer(out).writerows([*records, [f"{info_dir}/RECORD", "", ""]])
        archive.writestr(f"{info_dir}/RECORD", out.getvalue())
    return target


def wheelhouse_tar(wheels: list[Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for wheel in wheels:
            tar.add(wheel, arcname=wheel.name)
    return buffer.getvalue()


def install_script(prefix: str, pins: dict[str, str], record: dict[str, str] | None = None) -> str:
    """The shell run on the machine: unpack the wheels, make or reuse the venv, install the pins.

    The first pip call resolves and fetches the dependencies; the second puts exactly these wheels
    in place (a source checkout's code can change without its version number changing).
    """
    wheels = f"{prefix}/wheels"
    specs = " ".join(shlex.quote(f"{name}=={version}") for name, version in pins.items())
    p = shlex.quote(prefix)
    pip = f"{p}/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir"
    return "\n".join(
        [
            "set -eu",
            "command -v python3 >/dev/null || { echo 'rdc: python3 (3.11+) is not installed' >&2; exit 3; }",
            f"rm -rf {shlex.quote(wheels)}; mkdir -p {shlex.quote(wheels)}",
            f"tar -x -C {shlex.quote(wheels)}",
            f"[ -x {p}/bin/python ] || python3 -m venv {p}",
            f"{pip} --find-links {shlex.quote(wheels)} {specs} >&2",
            f"{pip} --no-deps --force-reinstall {shlex.quote(wheels)}/*.whl >&2",
            f"test -x {p}/bin/rdc-agent",
            f"printf '%s\\n' {shlex.quote(json.dumps(record or {}, sort_keys=True))} > {p}/{RECORD}",
        ]
    )


def installed_record(ssh: SshMachine, prefix: str) -> dict[str, str] | None:
    """What the last whole install on the machine recorded of its wheels (None: nothing known)."""
    argv = ssh.argv("cat " + shlex.quote(f"{prefix}/{RECORD}"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=CONNECT_TIMEOUT + 20, check=False)
    if proc.returncode == 255:
        raise classify(ssh, proc.returncode, proc.stderr)
    try:
        found = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def run_install(ssh: SshMachine, script: str, archive: bytes) -> tuple[int, str]:
    """`script` run on the machine with the wheelhouse `archive` as its input: the exit status and
    the output (255: ssh's own, for `classify`)."""
    argv = ssh.argv("sh -c " + shlex.quote(script))
    with stderr_file() as errfile:
        proc = subprocess.run(argv, input=archive, stdout=errfile, stderr=errfile, timeout=PIP_TIMEOUT)
        errfile.seek(0)
        return proc.returncode, errfile.read().decode(errors="replace")


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="rdc-wheels-")
