"""Every `rdc` command, declared once: where its code is, where it runs, its one-line help and what
its parameters complete.

Pure data, importable before click or any command. What reads it:
- the CLI's lazy groups (`rediacc_core.cli.groups`): a group's subcommands are the records under its
  path; a command's module is imported only when it runs, and `rdc --help` and a group's help list
  the one-line helps from here without importing any command;
- the launcher and `rediacc_core.remote`: which commands run on the SSH machine they name, and how
  they name it (`FORWARDED`), and which of them only read (`only_reads`);
- shell completion (`rediacc_core.cli.completion`): which completer each parameter gets;
- the command reference, `docs/commands.md`, written by `python -m rediacc_core.cli.reference`
  (`tests/test_commands.py` holds it current).

A command's module defines it with `@click.command()` (or `@click.group(cls=HintingGroup)`) and the
rest of its help (the paragraphs after the first, and its examples); its group attaches it from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

# How a forwarded command names its machine, in its first argument: the machine itself
# (`MACHINE`/`NAME`), or a repo reference that may carry `@machine` (`REF`).
Target = Literal["machine", "ref"]

# What a parameter completes (`rediacc_core.cli.completion` has one completer for each).
Completes = Literal["machine", "repo", "new-repo", "device", "granted", "held-back", "setting"]


@dataclass(frozen=True)
class Placement:
    """Where a command runs when it names an SSH machine: here, or forwarded to the machine."""

    target: Target | None  # None: the command runs here, on this host's config, whatever it names
    read_only: bool = False  # on the machine it stops once its client is gone (no one reads it)


LOCAL = Placement(None)
ON_MACHINE = Placement("machine")
ON_REF = Placement("ref")
READ_MACHINE = Placement("machine", read_only=True)
READ_REF = Placement("ref", read_only=True)
# Asked of this rdc, never of a machine: no config to read for them.
LOCAL_ONLY = frozenset({"--version", "--help", "-h"})


@dataclass(frozen=True)
class Command:
    """One command or group of the `rdc` tree.

    `code` is "module:attribute" under `rediacc_core.cli` (the click command or group object);
    `placement` is None for a group (its subcommands say where they run); `summary` is the line every
    listing shows and the first paragraph of the command's `--help`; `completes` maps a parameter's
    name to what the shell completes for it.
    """

    path: tuple[str, ...]
    code: str
    placement: Placement | None
    summary: str
    completes: Mapping[str, Completes] = field(default_factory=dict)
    hidden: bool = False  # run by systemd's units, not typed: left out of listings

    @property
    def group(self) -> bool:
        return self.placement is None


TABLE: tuple[Command, ...] = (
    Command(
        ("completion",),
        "completion:completion",
        LOCAL,
        "Print the script that makes SHELL complete rdc's commands, machines, repos and CDI names.",
    ),
    Command(
        ("demo",),
        "demo:demo",
        LOCAL,
        "Build a simulated machine, register it as `demo`, set it up and list its GPUs.",
    ),
    Command(
        ("machine",),
        "machine:machine",
        None,
        "Machines: where their root is, their settings, setup and GPUs.",
    ),
    # Local ones work on this host's config, or make connections of their own (host keys, installs,
    # tunnels).
    Command(
        ("machine", "add"),
        "machine:add",
        LOCAL,
        "Register the machine NAME: a local root DIR, or a machine reached over SSH.",
    ),
    Command(
        ("machine", "config"),
        "machine_config:configure",
        ON_MACHINE,
        "Show or change the per-machine settings of NAME.",
        completes={"name": "machine", "assignments": "setting", "unset": "setting"},
    ),
    Command(
        ("machine", "gpu"),
        "machine_gpu:gpu",
        None,
        "The GPUs of a machine.",
    ),
    Command(
        ("machine", "gpu", "clear"),
        "machine_gpu:gpu_clear",
        ON_MACHINE,
        "Let containers holding a GPU its driver reported unhealthy start again (once it is sound).",
        completes={"name": "machine", "device": "held-back"},
    ),
    Command(
        ("machine", "gpu", "list"),
        "machine_gpu:gpu_list",
        READ_MACHINE,
        (
            "Each GPU, every grantable CDI name, the grants in force (read live), and the GPUs held back "
            "because their driver reported a fatal event (as recorded: each repo gate reads the kernel's "
            "log every 30 s and before a container holding devices starts; --scan reads it now)."
        ),
        completes={"name": "machine"},
    ),
    Command(
        ("machine", "gpu", "prune"),
        "machine_gpu:gpu_prune",
        ON_MACHINE,
        'Remove the grants left behind by repos that no longer exist on NAME (shown as "deleted repo").',
        completes={"name": "machine"},
    ),
    Command(
        ("machine", "install"),
        "machine_ssh:install_command",
        LOCAL,
        "Install this client's rediacc-core and plugin versions on the SSH machine NAME (a venv there).",
        completes={"name": "machine"},
    ),
    Command(
        ("machine", "list"),
        "machine:list_machines",
        LOCAL,
        "List the configured machines (localhost always among them) and the settings set on each.",
    ),
    Command(
        ("machine", "refresh"),
        "machine:refresh",
        ON_MACHINE,
        (
            "Follow a driver update or a GPU repartition on NAME (default localhost): discover its GPUs "
            "again, check the CDI specs on it (which a vendor's toolkit may have rewritten) and rewrite "
            "its inventory. Nothing is installed and no spec is generated."
        ),
        completes={"name": "machine"},
    ),
    Command(
        ("machine", "remove"),
        "machine:remove",
        LOCAL,
        (
            "Forget the machine NAME (nothing under its root is touched). Refused while a repo of it "
            "runs: its daemon could no longer be reached by name."
        ),
        completes={"name": "machine"},
    ),
    Command(
        ("machine", "setup"),
        "machine:setup",
        ON_MACHINE,
        "Discover the GPUs of NAME, write its CDI specs and its inventory.",
        completes={"name": "machine"},
    ),
    Command(
        ("machine", "trust"),
        "machine_ssh:trust",
        LOCAL,
        "Trust the host key the SSH machine NAME presents now (replacing one trusted before).",
        completes={"name": "machine"},
    ),
    Command(
        ("plugins",),
        "plugins:plugins",
        LOCAL,
        "List the plugins: name, distribution, version, hooks implemented, load errors.",
    ),
    Command(
        ("repo",),
        "repo:repo",
        None,
        "Repos: isolated Docker workloads on a machine, each with its own daemon behind the gate.",
    ),
    # Decides offline, on the machine whose grants it reads.
    Command(
        ("repo", "check"),
        "repo_check:check",
        READ_REF,
        "Say what the repo's gate would decide for a Compose file or a docker run line, sending nothing.",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "create"),
        "repo:create",
        ON_REF,
        "Create a repo with a new identity and no grants (`-o json` prints its id for scripts).",
        completes={"ref": "new-repo"},
    ),
    Command(
        ("repo", "delete"),
        "repo:delete",
        ON_REF,
        "Delete a repo and its grants.",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "docker-host"),
        "repo_run:docker_host",
        READ_REF,
        (
            "Print the DOCKER_HOST value of the repo: its gate's socket (a local tunnel's, for an SSH "
            "machine)."
        ),
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "dockerd"),
        "repo_run:dockerd",
        ON_REF,
        "Run only the repo's own dockerd, in the foreground (systemd's dockerd unit).",
        completes={"ref": "repo"},
        hidden=True,
    ),
    Command(
        ("repo", "down"),
        "repo_run:down",
        ON_REF,
        "Stop the repo's gate and, when rdc started it, its Docker daemon (and so its containers).",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "env"),
        "repo_ssh:env",
        LOCAL,
        "Print `export DOCKER_HOST=…` for REPO's gate (over a tunnel for an SSH machine).",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "fork"),
        "repo:fork",
        ON_REF,
        "Copy REPO as NAME:TAG: its files, images, volumes and containers, under a new identity.",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "gate"),
        "repo_run:gate",
        None,
        "Run a repo's gate (rdc repo gate REPO), or read its audit trail (rdc repo gate log REPO).",
    ),
    Command(
        ("repo", "gate", "log"),
        "repo_run:gate_log",
        READ_REF,
        "Print the gate's decisions: who (pid/uid/gid) asked what, and what the gate said.",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "gate", "run"),
        "repo_run:gate_run",
        ON_REF,
        "Run only the repo's gate, in the foreground (the daemon must be up: systemd's gate unit).",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "gpu"),
        "repo:gpu",
        None,
        "GPU grants: the exact CDI device names a repo may use.",
    ),
    Command(
        ("repo", "gpu", "confirm"),
        "repo:confirm",
        ON_REF,
        "Accept the hardware REPO's grants reach now: bind them to it and lift their suspension.",
        completes={"ref": "repo", "devices": "granted"},
    ),
    Command(
        ("repo", "gpu", "grant"),
        "repo:grant",
        ON_REF,
        "Grant REPO the named devices (all of them or none); takes effect at its next Docker request.",
        completes={"ref": "repo", "devices": "device"},
    ),
    Command(
        ("repo", "gpu", "leases"),
        "repo_lease:leases",
        LOCAL,
        (
            "REPO's Slurm leases, pending and running (the job, its state, its (expected) start and end), "
            "the GPU minutes left to each account that may lease for it (a warning from 80 % used) with "
            "its fair share (its share of the cluster, and of the cluster's usage: `sshare`), and the GPU "
            "hours its leases on this node took this month (Slurm's accounting, `sacct`)."
        ),
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "gpu", "list"),
        "repo:list_grants",
        READ_REF,
        "The grants in force for REPO, read from the machine now.",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "gpu", "release"),
        "repo_lease:release",
        LOCAL,
        "End REPO's Slurm leases early: scancel, and revoke their grants with --stop.",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "gpu", "renew"),
        "repo:renew",
        ON_REF,
        "Move the end of REPO's leased grants (all of them or none); a lease already over is gone.",
        completes={"ref": "repo", "devices": "granted"},
    ),
    Command(
        ("repo", "gpu", "request"),
        "repo_lease:request",
        LOCAL,
        (
            "Ask Slurm for a lease of GPUs for REPO on its machine's node: `salloc --no-shell`, with "
            "memory and CPUs of its own. When the job starts, the prolog grants its GPUs to REPO until "
            "its end. With --external, an external job (Slurm 25.05 or later) that `rdc slurm bridge` "
            "grants."
        ),
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "gpu", "revoke"),
        "repo:revoke",
        ON_REF,
        "Revoke REPO's grants of the named devices (all of them or none).",
        completes={"ref": "repo", "devices": "granted"},
    ),
    Command(
        ("repo", "list"),
        "repo:list_repos",
        READ_MACHINE,
        "The repos on MACHINE with their GPU grants (`*` marks an exclusive grant).",
        completes={"machine_name": "machine"},
    ),
    Command(
        ("repo", "slurm"),
        "repo_slurm:slurm",
        None,
        "Who may lease GPUs for a repo through Slurm (its job's user or account).",
    ),
    Command(
        ("repo", "slurm", "allow"),
        "repo_slurm:allow",
        ON_REF,
        (
            "Let jobs of these Slurm accounts or users lease GPUs for REPO (the prolog checks "
            "SLURM_JOB_USER and SLURM_JOB_ACCOUNT; naming the repo in a job is never enough)."
        ),
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "slurm", "deny"),
        "repo_slurm:deny",
        ON_REF,
        "Take accounts or users off REPO's list (leases already granted run to their end).",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "slurm", "show"),
        "repo_slurm:show",
        READ_REF,
        "Show who may lease GPUs for REPO through Slurm.",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "tunnel"),
        "repo_ssh:tunnel_command",
        LOCAL,
        "Forward a local socket to REPO's gate on its SSH machine and print its DOCKER_HOST.",
        completes={"ref": "repo"},
    ),
    # Forwarded: --install writes unit files there.
    Command(
        ("repo", "units"),
        "repo_run:units",
        ON_REF,
        "Print the systemd units that run the repo at boot (templates ship with rdc).",
        completes={"ref": "repo"},
    ),
    Command(
        ("repo", "up"),
        "repo_run:up",
        ON_REF,
        "Start the repo's Docker daemon and its gate; return once the gate answers.",
        completes={"ref": "repo"},
    ),
    Command(
        ("slurm",),
        "slurm:slurm",
        None,
        "Fleet scheduling with Slurm: Slurm allocates GPUs, rdc turns each allocation into a grant.",
    ),
    # Slurm's side runs on the node itself (slurmd's hooks, its CLIs), or on a directory-rooted
    # machine: not forwarded to an SSH machine (README: "not over SSH"). A box's own files, which
    # external mode's bridge reaches over SSH too, are: its gres map, and its part of each round.
    Command(
        ("slurm", "bridge"),
        "slurm:bridge",
        LOCAL,
        (
            "External mode (Slurm 25.05 or later): the GPU boxes are State=EXTERNAL nodes with no slurmd, "
            "and this bridge grants each RUNNING external job's GPUs on its box to the job's repo (tagged "
            "with the job, until its end), revokes them (and stops the repo's containers) once the job no "
            "longer runs, and cancels a job rdc refuses with the reason in its AdminComment. MACHINE: the "
            "boxes (default: every machine with a gres map this host reads, `rdc slurm gres`); each box's "
            "node is its map's. A box over SSH is bridged when named: its part of each round runs there "
            "(`rdc slurm bridge-step`, through its rdc-agent)."
        ),
    ),
    Command(
        ("slurm", "bridge-step"),
        "slurm:bridge_step",
        ON_MACHINE,
        (
            "One box's part of a bridge round, run on the box (`rdc slurm bridge` runs it, over SSH for a "
            "box reached so): revoke the grants whose job is not in --jobs, renew those whose job's end "
            "moved, and grant each RUNNING job on MACHINE's node (its gres map's) that names a repo, as "
            "the prolog decides. It calls no Slurm tool: a job it refuses is in its answer, and the "
            "bridge cancels it. It is the bridge's to run: by hand, give it every live job, since a grant "
            "whose job is not among them is revoked."
        ),
    ),
    Command(
        ("slurm", "epilog"),
        "slurm:epilog",
        LOCAL,
        "slurmd's Epilog: revoke what the job was granted on MACHINE and stop its containers.",
    ),
    Command(
        ("slurm", "gres"),
        "slurm:gres",
        ON_MACHINE,
        (
            "Write MACHINE's gres.conf (every GPU, explicit File= lines, AutoDetect=off) and the index "
            "map beside it, from its inventory; print the slurm.conf line (Gres=, Features=) for the "
            "node."
        ),
    ),
    Command(
        ("slurm", "health"),
        "slurm:health",
        LOCAL,
        (
            "Pass MACHINE's GPU health to Slurm: read the kernel log now, drain the node while a card is "
            "held back or its grant is suspended for drift (the reason names the card) and resume it once "
            "every card is cleared and every such grant confirmed or revoked. A drain that is not one of "
            "these reasons of rdc's is left as it is. Each repo gate's housekeeping round does the same."
        ),
    ),
    Command(
        ("slurm", "prolog"),
        "slurm:prolog",
        LOCAL,
        (
            "slurmd's Prolog (root, the job's environment): grant the job's GPUs to its repo until the "
            "job's end, or cancel the job with rdc's reason. Exit 0 unless something is broken."
        ),
    ),
    Command(
        ("slurm", "reconcile"),
        "slurm:reconcile",
        LOCAL,
        (
            "Hold MACHINE's job-tagged grants to the jobs Slurm runs: revoke (and stop) those whose job "
            "is gone (an epilog does not run when slurmd or the node dies), renew those whose job's end "
            "moved (`scontrol update JobId=… TimeLimit=…`). Each is in the repo's audit log. Setup, "
            "refresh and every repo gate's housekeeping round (about every 30 s) run it too; this runs it "
            "now."
        ),
    ),
)

BY_PATH: dict[tuple[str, ...], Command] = {c.path: c for c in TABLE}


def children(path: tuple[str, ...]) -> dict[str, Command]:
    """The commands directly under `path` (`()`: the top level), by name."""
    return {c.path[-1]: c for c in TABLE if c.path[:-1] == path}


# Where each command (not group) runs, and the forwarded ones with how each names its target:
# what the launcher's `fast_target` reads.
PLACEMENTS: dict[tuple[str, ...], Placement] = {c.path: c.placement for c in TABLE if c.placement is not None}
FORWARDED: dict[tuple[str, ...], Target] = {
    path: p.target for path, p in PLACEMENTS.items() if p.target is not None
}
READ_ONLY = frozenset(path for path, p in PLACEMENTS.items() if p.read_only)
_DEPTH = max(len(path) for path in PLACEMENTS)


def only_reads(argv: Sequence[str]) -> bool:
    """Whether `rdc ARGV` runs a read-only command, told from its leading words: no group of the
    tree takes an option before its subcommand but help, which runs nothing."""
    return any(tuple(argv[:size]) in READ_ONLY for size in range(1, _DEPTH + 1))
