"""The benchmark with the gate of another commit in the gate's place.

    python bench/gate_at.py REV [run.py arguments]

Extracts REV's tree (`git archive`) into a temporary directory and runs `bench/run.py` (this
checkout's benchmark, same scenarios and report) with `RDC_BENCH_GATE_CMD` set to that tree's gate,
its plugins first on the import path. So a run measures an old gate against HAProxy on this
machine, and a run of this checkout beside it answers "how much faster than REV" in ratios to the
same HAProxy, whatever machine the two runs share. REV's gate must accept the command line the
benchmark gives (`--machine --root --repo-id --listen --upstream`: every commit since the gate had
a serve module) and read the machine this checkout's code sets up. Results go to
`bench/results/quick/at-<rev>` (not committed) unless `--out` is given; the report names the
command that stood in the gate's place.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Where the gate's entry point lived: the runtime moved out of gate/ in issue 13.
SERVE_MODULES = ("rediacc_core/runtime/serve.py", "rediacc_core/gate/serve.py")


def resolve(rev: str) -> str:
    """REV's full commit id."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True, text=True,
    )  # fmt: skip
    if found.returncode != 0:
        raise SystemExit(f"bench: {rev!r} names no commit in {REPO}")
    return found.stdout.strip()


def extract(commit: str, into: Path) -> None:
    """Writes the commit's tree under `into`."""
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"bench: git archive {commit} failed")


def gate_command(tree: Path) -> str:
    """RDC_BENCH_GATE_CMD for the gate in `tree`, its packages ahead of the installed ones."""
    module = next((m for m in SERVE_MODULES if (tree / m).is_file()), None)
    if module is None:
        raise SystemExit(f"{tree} has no gate entry point ({', '.join(SERVE_MODULES)})")
    paths = [str(tree), *sorted(str(p) for p in (tree / "plugins").iterdir() if p.is_dir())]
    dotted = module.removesuffix(".py").replace("/", ".")
    # -P: the benchmark starts the gate from this checkout, whose own packages must not come first.
    return (
        f"env PYTHONPATH={':'.join(paths)} {{python}} -P -m {dotted} --machine {{machine}} "
        "--root {root} --repo-id {repo_id} --listen {listen} --upstream {upstream}"
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    rev, rest = argv[0], argv[1:]
    commit = resolve(rev)
    # The directory's name says which commit's gate ran: the report quotes its command line.
    with tempfile.TemporaryDirectory(prefix=f"rdc-gate-at-{commit[:12]}-") as tmp:
        extract(commit, Path(tmp))
        env = dict(os.environ, RDC_BENCH_GATE_CMD=gate_command(Path(tmp)))
        if not any(a == "--out" or a.startswith("--out=") for a in rest):
            rest += ["--out", str(HERE / "results" / "quick" / f"at-{commit[:7]}")]
        print(f"bench: the gate of {commit[:12]} in the gate's place", flush=True)
        return subprocess.run([sys.executable, str(HERE / "run.py"), *rest], env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
