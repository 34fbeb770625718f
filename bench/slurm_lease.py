"""The Slurm lease benchmark: how soon a lease's start lets the repo's `docker run` through its gate,
and how soon its end stops the repo's containers (prolog mode, a real Slurm cluster).

    python bench/slurm_lease.py [--rounds 7] [--out bench/results]

Builds the Slurm suite's cluster (tests/slurm_kit.py: slurmctld, slurmdbd on MariaDB, MUNGE, one
slurmd per simulated rdc machine in namespaces of its own, the prolog and epilog as README writes
them), brings repo alpha of node n1 up (its own dockerd behind its gate) and lets team A lease for
it. Then, after one warm-up round that is not counted, each round:

- **start**: `salloc --no-shell` of one GPU of n1 for alpha, the cluster idle. The lease starts when
  salloc says `Granted job allocation` (the bench reads its stderr as it comes): slurmctld has
  allocated the job, which is RUNNING (CONFIGURING while the prolog runs), and slurmd launches the
  prolog. From then, the real docker CLI asks the gate `docker run -d --device nvidia.com/gpu=0`,
  again as soon as a refusal comes back, until one is admitted; the time is until that `docker run`
  has returned (its container runs). Also noted: when the prolog's grant was written, when salloc
  returned, how many runs the gate refused first.
- **end**: a second container holds the card too, a `sleep` that ignores SIGTERM (PID 1 of its
  container), so that only SIGKILL after the stop's grace (10 s, `runtime.holdings.STOP_TIMEOUT`)
  ends it; the first one exits on SIGTERM. The lease ends at `scancel`; the time is until the repo's
  daemon lists no running container (asked every 50 ms on its own socket, not through the gate).
  Also noted: when the epilog's revocation was written and when the first container stopped.

Goals (issue 39): start to admitted <= 2 s, end to last stopped <= 12 s (the grace included), on a
2-core host. These are wall times, latencies: the output says how busy the host was meanwhile.
Writes `slurm-lease.md` and `slurm-lease.json` to the output directory. Needs root, Docker Engine
>= 25 with CDI and busybox-static (.ci/install-docker.sh), Slurm, MUNGE and MariaDB
(.ci/install-slurm.sh); run it under `flock /tmp/e2e.lock` beside the e2e suites. ~3 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the Slurm suite's kit

import slurm_kit  # type: ignore[import-not-found, unused-ignore]
from fleet import host_busy

from rediacc_core.config import Config
from rediacc_core.grants.records import read_grants
from rediacc_core.machine import Machine
from rediacc_core.testing.dockerenv import docker_unavailable

NODE, REPO = "n1", "alpha"
GPU = "nvidia.com/gpu=0"
IMAGE = "bb:latest"
POLITE = ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]  # exits on SIGTERM
STUBBORN = ["sleep", "600"]  # PID 1 of its container: SIGTERM does nothing, SIGKILL after the grace
GOALS = {"start": 2.0, "end": 12.0}
POLL = 0.05  # seconds between two looks at the daemon's containers or the grants file
STEP_TIMEOUT = 120.0  # seconds any one wait may take


@dataclass
class Round:
    """One lease's times, in seconds from its start (`start`) or from its end (`end`)."""

    start: dict[str, float] = field(default_factory=dict)
    end: dict[str, float] = field(default_factory=dict)
    refused_runs: int = 0


class GrantWatch:
    """Notes, in a thread, when the grants file first shows (or no longer shows) a job's grant."""

    def __init__(self, machine: Machine, tag: str, present: bool) -> None:
        self.machine, self.tag, self.present = machine, tag, present
        self.seen: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        path = self.machine.grants_path
        last: int | None = None
        while not self._stop.is_set():
            stamp = path.stat().st_mtime_ns if path.exists() else 0
            if stamp != last:  # read only what changed: the host has two cores
                last = stamp
                if any(g.job == self.tag for g in read_grants(self.machine)) == self.present:
                    self.seen = time.monotonic()
                    return
            self._stop.wait(POLL / 5)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        if self.seen is None:
            state = "appear" if self.present else "go"
            raise SystemExit(f"the grant of {self.tag} did not {state} in {self.machine.grants_path}")
        return self.seen


def wait(what: str, check: Callable[[], bool]) -> float:
    """Poll `check` every POLL seconds; the monotonic time it first held."""
    deadline = time.monotonic() + STEP_TIMEOUT
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(POLL)
    raise SystemExit(f"timed out after {STEP_TIMEOUT:.0f} s waiting for {what}")


def running(env: Any) -> set[str]:
    status, listed = env.daemon_api("GET", "/containers/json")
    if status != 200:
        raise SystemExit(f"the repo's daemon answered {status} to GET /containers/json: {listed}")
    return {name.lstrip("/") for entry in listed for name in entry["Names"]}


def one_round(cluster: Any, env: Any, machine: Machine) -> Round:
    result = Round()
    job = cluster.lease(REPO, node=NODE, ready=False)  # returns on salloc's "Granted job allocation"
    began = time.monotonic()
    salloc = cluster.procs.pop(f"salloc-{job}")
    tag = f"slurm:{slurm_kit.CLUSTER}/{job}"
    written = GrantWatch(machine, tag, present=True)
    salloc_done: list[float] = []

    def note_salloc() -> None:
        salloc.wait()
        salloc_done.append(time.monotonic())

    waiter = threading.Thread(target=note_salloc)
    waiter.start()
    while True:
        run = env.docker("run", "-d", "--name", "polite", "--device", GPU, IMAGE, *POLITE)
        if run.returncode == 0:
            result.start["admitted"] = time.monotonic() - began
            break
        if GPU not in run.stderr or time.monotonic() - began > STEP_TIMEOUT:
            raise SystemExit(f"docker run failed, and not for want of {GPU}: {run.stderr}")
        result.refused_runs += 1
    waiter.join(STEP_TIMEOUT)
    said = salloc.stderr.read() if salloc.stderr is not None else ""
    if "queued" in said or salloc.returncode != 0:  # the start must be the grant itself
        raise SystemExit(f"salloc waited in the queue or failed ({salloc.returncode}): {said}")
    grant = written.stop()
    result.start |= {
        "grant written (prolog)": grant - began,
        "salloc returned": salloc_done[0] - began,
    }
    result.end |= end_lease(cluster, env, machine, tag, job, "epilog")
    # The next lease starts on an idle cluster: the epilog done, the node idle.
    wait("the job to end", lambda: cluster.job_state(job) not in ("RUNNING", "COMPLETING"))
    wait("n1 idle", lambda: cluster.node_state(NODE) == "idle")
    return result


def end_lease(cluster: Any, env: Any, machine: Machine, tag: str, job: str, revoker: str) -> dict[str, float]:
    """Start the holder that ignores SIGTERM beside the polite one, `scancel` the lease, and time
    from then to the first and the last container stopped and to the grant's revoke (by `revoker`);
    both holders are removed after."""
    started = env.docker("run", "-d", "--name", "stubborn", "--device", GPU, IMAGE, *STUBBORN)
    if started.returncode != 0:
        raise SystemExit(f"the second holder did not start: {started.stderr}")
    revoked = GrantWatch(machine, tag, present=False)
    ended = time.monotonic()
    cluster.slurm("scancel", job)
    first = wait("a holder to stop", lambda: len(running(env) & {"polite", "stubborn"}) < 2)
    last = wait("every container of the repo to stop", lambda: not running(env))
    gone = revoked.stop()
    for name in ("polite", "stubborn"):
        env.daemon_api("DELETE", f"/containers/{name}?force=1")
    return {
        "last container stopped": last - ended,
        f"grant revoked ({revoker})": gone - ended,
        "first container stopped": first - ended,
    }


def measure(rounds: int) -> tuple[list[Round], dict[str, Any]]:
    load: dict[str, Any] = {"loadavg at launch": os.getloadavg()}  # before any of this bench's work
    with slurm_kit.running_cluster() as cluster:
        allowed = cluster.rdc("repo", "slurm", "allow", f"{REPO}@{NODE}", "--account", "teama")
        if allowed.returncode != 0:
            raise SystemExit(f"rdc repo slurm allow failed: {allowed.stderr}")
        machine = Config.load(cluster.config_path).machine(NODE)
        with slurm_kit.repo_up(cluster, NODE, REPO) as env:
            refused = env.docker("run", "--rm", "--device", GPU, IMAGE, "true")
            if refused.returncode == 0:
                raise SystemExit(f"the gate admitted {GPU} before any lease")
            one_round(cluster, env, machine)  # warm-up: caches, the CLI's first run
            load["loadavg before"] = os.getloadavg()
            busy, clock = host_busy(), time.monotonic()
            measured = []
            for n in range(rounds):
                measured.append(one_round(cluster, env, machine))
                print(f"round {n + 1}/{rounds}: {describe(measured[-1])}", flush=True)
            cores = os.cpu_count() or 1
            load |= {
                "loadavg after": os.getloadavg(),
                "host CPU busy %": 100 * (host_busy() - busy) / (time.monotonic() - clock) / cores,
            }
    return measured, load


def describe(r: Round) -> str:
    return (
        f"start -> admitted {r.start['admitted']:.2f} s ({r.refused_runs} refused first), "
        f"end -> last stopped {r.end['last container stopped']:.2f} s"
    )


def version(*argv: str) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except OSError:
        return "?"
    return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else "?"


def phase_rows(rounds: list[Round]) -> tuple[list[str], dict[str, dict[str, float]]]:
    """The table's rows, a timing each (median, min, max; the two the goals judge in bold), and
    those numbers by `phase -> what`."""
    rows: list[str] = []
    summary: dict[str, dict[str, float]] = {}
    for phase, label in (("start", "lease start"), ("end", "lease end")):
        for what in getattr(rounds[0], phase):
            values = [getattr(r, phase)[what] for r in rounds]
            key = f"{label} -> {what}"
            summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
            primary = what in ("admitted", "last container stopped")
            goal = f"<= {GOALS[phase]:.0f} s" if primary else ""
            to = "first admitted `docker run` returned" if what == "admitted" else what
            cells = [f"{summary[key][k]:.2f}" for k in ("median", "min", "max")]
            if primary:
                cells = [f"**{c}**" for c in cells]
            rows.append(f"| {label} | {to} | {goal} | " + " | ".join(cells) + " |")
    return rows, summary


def report(rounds: list[Round], load: dict[str, Any], out: Path) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    launch, before, after = load["loadavg at launch"], load["loadavg before"], load["loadavg after"]
    lines = [
        f"# Slurm lease benchmark, {when}, commit {commit or '?'}",
        "",
        f"{platform.node()}: {os.cpu_count()} CPUs; {version('slurmctld', '-V')}, "
        f"{version('dockerd', '--version')}; prolog mode; {len(rounds)} rounds after a warm-up, "
        "wall times in seconds.",
        f"Host load (1, 5, 15 min): loadavg {' '.join(f'{v:.2f}' for v in launch)} at launch (before "
        f"the cluster was built), {' '.join(f'{v:.2f}' for v in before)} before the rounds, "
        f"{' '.join(f'{v:.2f}' for v in after)} after them; the host's CPUs were "
        f"{load['host CPU busy %']:.0f} % busy over the rounds (every process: other users', the "
        "cluster's, and this benchmark's `docker run` loop).",
        "",
        "Start: salloc's `Granted job allocation` (job allocated, prolog launched). End: `scancel`.",
        "",
        "| from | to | goal | median | min | max |",
        "|---|---|---|---|---|---|",
    ]
    rows, summary = phase_rows(rounds)
    lines += rows
    refusals = [r.refused_runs for r in rounds]
    lines += [
        "",
        f"`docker run` refused before the first admitted: median {statistics.median(refusals):g}, "
        f"max {max(refusals)}.",
    ]
    met = {
        "start": summary["lease start -> admitted"]["max"] <= GOALS["start"],
        "end": summary["lease end -> last container stopped"]["max"] <= GOALS["end"],
    }
    lines.append(
        "Goals (every round): "
        + ", ".join(f"{phase} {'met' if ok else 'MISSED'}" for phase, ok in met.items())
        + "."
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "slurm-lease.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    samples = [{"start": r.start, "end": r.end, "refused_runs": r.refused_runs} for r in rounds]
    document = {"when": when, "commit": commit, "load": load, "rounds_s": samples, "summary_s": summary}
    (out / "slurm-lease.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    options = parser.parse_args()
    reason = slurm_kit.cannot_run() or docker_unavailable()
    if reason is not None:
        raise SystemExit(f"cannot run: {reason}")
    rounds, load = measure(options.rounds)
    report(rounds, load, options.out)


if __name__ == "__main__":
    main()
