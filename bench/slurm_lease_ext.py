"""The Slurm lease benchmark in external mode: how soon an external job's start lets the repo's
`docker run` through its gate, and how soon its end stops the repo's containers (`rdc slurm bridge`
on a real Slurm 26.05 whose boxes run no slurmd).

    python bench/slurm_lease_ext.py [--rounds 7] [--interval 1] [--out bench/results]

Builds the external-mode suite's cluster (tests/slurm_ext_kit.py: slurmctld, slurmdbd, MUNGE from a
Debian sid root; three boxes, `State=EXTERNAL` nodes that are simulated rdc machines; the operator's
host `ops`), brings repo alpha of box x1 up (its own dockerd behind its gate), lets team A lease for
it and runs `rdc slurm bridge x1 --slurm ops --interval INTERVAL` in the background for the whole
run. Then, after one warm-up round that is not counted, each round:

- **start**: `rdc repo gpu request alpha@x1 --gres gpu:1 --external ops` (an external job, no
  script); the lease starts when `squeue` first shows it RUNNING (asked in a loop, each call about
  0.1 s here; the job's own start_time has whole seconds only). From the request on, the real
  docker CLI asks the gate `docker run -d --device nvidia.com/gpu=0` again as soon as a refusal
  comes back; the time is from RUNNING until the first admitted `docker run` has returned. Also
  noted: when the bridge's grant was written.
- **end**: a second container holds the card too, a `sleep` that ignores SIGTERM, so that only
  SIGKILL after the stop's grace (10 s) ends it. The lease ends at `scancel`; the time is until the
  repo's daemon lists no running container. Also noted: when the bridge's revocation was written
  and when the first container stopped.

Goals (issue 39, as in prolog mode): start to admitted <= 2 s, end to last stopped <= 12 s, on a
2-core host. The bridge's interval is a floor under both: a job that starts just after a round
waits a whole interval for the next. Writes `slurm-lease-ext.md` and `slurm-lease-ext.json`. Needs
root, Docker Engine >= 25 with CDI, the sid root (.ci/install-slurm-sid.sh) and the host's MariaDB
(.ci/install-slurm.sh); run it under `flock /tmp/e2e.lock`. ~3 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the Slurm suites' kits

import slurm_ext_kit  # type: ignore[import-not-found, unused-ignore]
import slurm_kit  # type: ignore[import-not-found, unused-ignore]
from fleet import host_busy
from slurm_lease import (
    GOALS,
    GPU,
    IMAGE,
    POLITE,
    STEP_TIMEOUT,
    GrantWatch,
    Round,
    end_lease,
    phase_rows,
    wait,
)

from rediacc_core.config import Config
from rediacc_core.machine import Machine
from rediacc_core.testing.dockerenv import docker_unavailable

BOX, REPO = "x1", "alpha"


class RunningWatch:
    """Notes, in a thread, when squeue first shows the job RUNNING."""

    def __init__(self, cluster: Any, job: str) -> None:
        self.cluster, self.job = cluster, job
        self.seen: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT
        while time.monotonic() < deadline:
            said = self.cluster.slurm("squeue", "-h", "-j", self.job, "-o", "%T", check=False).stdout
            if said.strip() == "RUNNING":
                self.seen = time.monotonic()
                return

    def wait(self) -> float:
        self._thread.join()
        if self.seen is None:
            raise SystemExit(f"job {self.job} did not run within {STEP_TIMEOUT:.0f} s")
        return self.seen


def request(cluster: Any) -> str:
    done = cluster.rdc(
        "repo", "gpu", "request", f"{REPO}@{BOX}", "--gres", "gpu:1", "--for", "10m", "--mem", "100M",
        "--account", "teama", "--external", "ops", "-o", "json",
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"rdc repo gpu request failed: {done.stderr}")
    return str(json.loads(done.stdout)["job"])


def one_round(cluster: Any, env: Any, machine: Machine) -> Round:
    result = Round()
    job = request(cluster)
    tag = f"slurm:{slurm_kit.CLUSTER}/{job}"
    written = GrantWatch(machine, tag, present=True)
    started = RunningWatch(cluster, job)
    asked = time.monotonic()
    while True:
        run = env.docker("run", "-d", "--name", "polite", "--device", GPU, IMAGE, *POLITE)
        if run.returncode == 0:
            admitted = time.monotonic()
            break
        if GPU not in run.stderr or time.monotonic() - asked > STEP_TIMEOUT:
            raise SystemExit(f"docker run failed, and not for want of {GPU}: {run.stderr}")
        result.refused_runs += 1
    began = started.wait()
    grant = written.stop()
    result.start |= {"admitted": admitted - began, "grant written (bridge)": grant - began}
    result.end |= end_lease(cluster, env, machine, tag, job, "bridge")
    wait("the job to end", lambda: cluster.job_state(job) not in ("RUNNING", "COMPLETING"))
    return result


def measure(rounds: int, interval: float) -> tuple[list[Round], dict[str, Any]]:
    load: dict[str, Any] = {"loadavg at launch": os.getloadavg()}
    with slurm_ext_kit.running_ext_cluster() as cluster:
        allowed = cluster.rdc("repo", "slurm", "allow", f"{REPO}@{BOX}", "--account", "teama")
        if allowed.returncode != 0:
            raise SystemExit(f"rdc repo slurm allow failed: {allowed.stderr}")
        machine = Config.load(cluster.config_path).machine(BOX)
        log = open(cluster.base / "log" / "bridge.log", "ab")  # noqa: SIM115 - the child keeps it
        bridge = subprocess.Popen(
            [
                str(slurm_kit.BIN / "rdc"),
                "slurm",
                "bridge",
                BOX,
                "--slurm",
                "ops",
                "--interval",
                str(interval),
            ],
            env={**os.environ, "REDIACC_CONFIG": str(cluster.config_path)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            with slurm_kit.repo_up(cluster, BOX, REPO) as env:
                refused = env.docker("run", "--rm", "--device", GPU, IMAGE, "true")
                if refused.returncode == 0:
                    raise SystemExit(f"the gate admitted {GPU} before any lease")
                one_round(cluster, env, machine)  # warm-up
                load["loadavg before"] = os.getloadavg()
                busy, clock = host_busy(), time.monotonic()
                measured = []
                for n in range(rounds):
                    measured.append(one_round(cluster, env, machine))
                    r = measured[-1]
                    print(
                        f"round {n + 1}/{rounds}: start -> admitted {r.start['admitted']:.2f} s, "
                        f"end -> last stopped {r.end['last container stopped']:.2f} s",
                        flush=True,
                    )
                cores = os.cpu_count() or 1
                load |= {
                    "loadavg after": os.getloadavg(),
                    "host CPU busy %": 100 * (host_busy() - busy) / (time.monotonic() - clock) / cores,
                }
        finally:
            bridge.terminate()
            bridge.wait(30)
    return measured, load


def version(cluster_wrap: list[str], *argv: str) -> str:
    try:
        done = subprocess.run([*cluster_wrap, *argv], capture_output=True, text=True, timeout=30)
    except OSError:
        return "?"
    return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else "?"


def report(rounds: list[Round], load: dict[str, Any], interval: float, out: Path) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    launch, before, after = load["loadavg at launch"], load["loadavg before"], load["loadavg after"]
    slurm = version(["chroot", str(slurm_ext_kit.SID_ROOT)], "slurmctld", "-V")
    docker = version([], "dockerd", "--version")
    lines = [
        f"# Slurm lease benchmark, external mode, {when}, commit {commit or '?'}",
        "",
        f"{platform.node()}: {os.cpu_count()} CPUs; {slurm} (sid root), {docker}; external mode, "
        f"`rdc slurm bridge --interval {interval:g}`; {len(rounds)} rounds after a warm-up, wall "
        "times in seconds.",
        f"Host load (1, 5, 15 min): loadavg {' '.join(f'{v:.2f}' for v in launch)} at launch, "
        f"{' '.join(f'{v:.2f}' for v in before)} before the rounds, "
        f"{' '.join(f'{v:.2f}' for v in after)} after them; the host's CPUs were "
        f"{load['host CPU busy %']:.0f} % busy over the rounds (every process).",
        "",
        "Start: squeue first shows the external job RUNNING. End: `scancel`.",
        "",
        "| from | to | goal | median | min | max |",
        "|---|---|---|---|---|---|",
    ]
    rows, summary = phase_rows(rounds)
    lines += rows
    met = {
        "start": summary["lease start -> admitted"]["max"] <= GOALS["start"],
        "end": summary["lease end -> last container stopped"]["max"] <= GOALS["end"],
    }
    lines += [
        "",
        "Goals (every round): "
        + ", ".join(f"{phase} {'met' if ok else 'MISSED'}" for phase, ok in met.items())
        + ".",
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "slurm-lease-ext.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    samples = [{"start": r.start, "end": r.end, "refused_runs": r.refused_runs} for r in rounds]
    document = {
        "when": when, "commit": commit, "interval_s": interval, "load": load,
        "rounds_s": samples, "summary_s": summary,
    }  # fmt: skip
    (out / "slurm-lease-ext.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--interval", type=float, default=1.0, help="the bridge's, in seconds")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    options = parser.parse_args()
    os.environ[slurm_ext_kit.EXT_ENV] = "1"  # the kit's switch for the suite: running this asks for it
    reason = slurm_ext_kit.ext_skip_reason() or docker_unavailable()
    if reason is not None:
        raise SystemExit(f"cannot run: {reason}")
    rounds, load = measure(options.rounds, options.interval)
    report(rounds, load, options.interval, options.out)


if __name__ == "__main__":
    main()
