"""A read command loads only what it runs.

Operators run `rdc` dozens of times a day and scripts run it in loops, so a read (`repo gpu list`,
`machine gpu list`, `repo list`, `--help`) must not pay for the gate's decision engine, the CDI
spec machinery and jsonschema, the vendor plugins, pluggy or the YAML parser (`bench/cli_reads.py`
measures what that is worth). Each command runs in a fresh interpreter on a demo machine, twice:
the first run may parse the config and validate the state files once; the second must not.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

RUN_AND_LIST_MODULES = """
import json, os, sys
sys.argv = ["rdc", *json.loads(os.environ["RDC_TEST_ARGV"])]
from rediacc_core.launcher import main
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
with open(os.environ["RDC_TEST_OUT"], "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""

# What no read command needs.
NEVER = (
    "jsonschema",
    "yaml",
    "rediacc_core.gate",
    "rediacc_core.cdi.spec",
    "rediacc_core.cdi.registry",
    "rediacc_core.setup",
    "rediacc_core.demo",
    "rediacc_core.runtime.guard",
    "rediacc_core.remote.tunnel",
    "http.client",
)
# What only a write, a forward to an SSH machine or a mistyped name needs.
ASIDE = ("rediacc_core.remote.agentcall", "rediacc_core.telemetry", "difflib", "ctypes")
# What the stdlib's importlib.metadata loads itself.
METADATA = ("importlib.resources", "tempfile", "email", "zipfile", "csv")
# What only a command that works with plugins needs.
VENDORS = ("rediacc_nvidia", "rediacc_dri", "rediacc_amd")
PLUGINS = ("pluggy", "importlib.metadata", "rediacc_core.plugins", *VENDORS)
LIGHT = NEVER + ASIDE + METADATA + PLUGINS
# What only a command that shows or changes settings needs.
SETTINGS = ("rediacc_core.settings", "rediacc_core.publishing", "rediacc_core.cli.machine_config")
# What only a command that shows grants needs.
GRANTS = ("rediacc_core.grants", "rediacc_core.bindings")
# What only starting or stopping a repo's parts needs: `repo list` reads which run through their
# paths and pidfiles (`runtime.layout`, `runtime.status`), never the modules that make them.
RUNNING = (
    "rediacc_core.runtime.lifecycle",
    "rediacc_core.runtime.daemon",
    "rediacc_core.runtime.netns",
    "rediacc_core.runtime.rtnetlink",
    "rediacc_core.runtime.teardown",
    "socket",
)

# Settings are declared in the rooms that act on them and collected by the settings file's reader
# (`rediacc_core.settings`), which every command reading the file loads: those declarations, and the
# packages around them, which import nothing, are what a read may load of the gate and the runtime.
DECLARATIONS = frozenset(
    {
        "rediacc_core.gate",
        "rediacc_core.gate.policy",
        "rediacc_core.gate.policy.settings",
        "rediacc_core.runtime",
        "rediacc_core.runtime.settings",
    }
)

READS: list[tuple[list[str], tuple[str, ...]]] = [
    (["repo", "gpu", "list", "alpha@demo"], (*LIGHT, "rediacc_core.runtime")),
    (["repo", "list", "demo"], (*LIGHT, *RUNNING)),
    # The inventory, grants and health records: not the settings (read only for a card held back).
    (
        ["machine", "gpu", "list", "demo"],
        (*LIGHT, "rediacc_core.runtime", "rediacc_core.model", *SETTINGS),
    ),
    # The machines and their settings: not the grants or the GPU tables (`cli.machine_gpu`).
    (["machine", "list"], (*LIGHT, "rediacc_core.runtime", *GRANTS, "rediacc_core.cli.machine_gpu")),
    # A listing reads each command's one-line help from its record: no command module is imported.
    (["--help"], (*LIGHT, "rediacc_core.runtime", "rediacc_core.cli.machine", "rediacc_core.cli.repo")),
    (["machine", "gpu", "--help"], (*LIGHT, "rediacc_core.runtime", "rediacc_core.cli.repo")),
    # Each plugin's version comes from its distribution's metadata files (`rediacc_core.entrypoints`):
    # no plugin is imported, nor pluggy, nor importlib.metadata and what it loads.
    (
        ["--version"],
        (*NEVER, *ASIDE, *METADATA, "pluggy", "importlib.metadata", "rediacc_core.runtime", *VENDORS),
    ),
]


@pytest.fixture(scope="module")
def demo_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    base = tmp_path_factory.mktemp("reads")
    env = {**os.environ, "REDIACC_CONFIG": str(base / "rdc.yaml")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    built = subprocess.run(
        [sys.executable, "-m", "rediacc_core.cli", "demo", "--workdir", str(base / "demo")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    # Without a vendor plugin the demo machine has no GPU, so the demo makes no repos; the reads
    # below still need one to read.
    repos = subprocess.run(
        [sys.executable, "-m", "rediacc_core.cli", "repo", "list", "demo", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "alpha" not in repos.stdout:
        created = subprocess.run(
            [sys.executable, "-m", "rediacc_core.cli", "repo", "create", "alpha@demo"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert created.returncode == 0, created.stderr
    yield env


def loaded(env: dict[str, str], argv: list[str], out: Path) -> set[str]:
    run_env = {**env, "RDC_TEST_ARGV": json.dumps(argv), "RDC_TEST_OUT": str(out)}
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_MODULES], env=run_env, capture_output=True, text=True, timeout=120
    )
    result = json.loads(out.read_text())
    assert result["code"] in (0, None), proc.stderr
    return set(result["modules"])


@pytest.mark.parametrize(("argv", "forbidden"), READS, ids=[" ".join(a) for a, _ in READS])
def test_a_read_command_imports_only_what_it_runs(
    demo_env: dict[str, str], tmp_path: Path, argv: list[str], forbidden: tuple[str, ...]
) -> None:
    loaded(demo_env, argv, tmp_path / "first.json")  # may parse the config and check the files once
    modules = loaded(demo_env, argv, tmp_path / "second.json")
    pulled = sorted(
        m
        for m in modules
        if m not in DECLARATIONS and any(m == f or m.startswith(f + ".") for f in forbidden)
    )
    assert pulled == [], f"`rdc {' '.join(argv)}` imported {pulled}"


@pytest.mark.parametrize("module", sorted(DECLARATIONS))
def test_what_a_read_may_load_of_the_gate_and_the_runtime_imports_only_the_ground(module: str) -> None:
    """The settings declarations and their packages import nothing at their top but floor-0 modules
    (a value's check is imported when a value is checked), so loading them costs a read nothing of
    the gate's engine or the running parts."""
    package = Path(__file__).resolve().parents[1] / Path(*module.split("."))
    path = package / "__init__.py" if package.is_dir() else package.with_suffix(".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in tree.body if isinstance(node, ast.Import) for a in node.names}
    assert imported <= {"__future__", "rediacc_core.setting", "rediacc_core.values"}, imported
