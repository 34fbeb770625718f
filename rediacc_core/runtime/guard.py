"""The repo daemon's OCI runtime: runc behind a check that the container's device nodes are granted now.

The gate sees requests; it cannot see the daemon start a container on its own (a restart policy,
the daemon's own start after a crash or a reboot). Every one of those starts ends in the same
place: the daemon's shim runs the runtime binary to create the container, to exec into it and to
resume it. So each repo daemon's default runtime is this guard (named `GUARD_RUNTIME` in
`gate.policy.rules`, which admits no other; written into its daemon.json by `runtime.daemon`), and
the guard lets runc create, exec or resume only a container whose device nodes all belong to CDI
devices the repo holds at that moment (grants.json, read fresh each time; a lapsed lease, a grant
setup suspended, or a grant whose recorded hardware is not what its name reaches in the machine's
inventory, counts as absent). Whoever starts the container, the window between a revoke and the
refusal is zero.

It runs for every `runc create` on the machine, so it is written for start-up time: it is started
as `python -S -I guard.py` (no site, no user environment: 16 ms here against 85 ms), imports only
the standard library, and `exec`s runc once it has read the grants file (one small JSON file: a
repo being emptied for a handover, `grants.release`, may start no container at all) for a container
without device nodes (moby omits `linux.devices` then). Only a container with devices pays for
reading the inventory (`--inventory`; JSON, about 0.1 ms: specs rewritten since it was written, a
driver update or two cards that exchanged slots, refuse until `rdc machine refresh`, as the gate's
rule `stale-facts` does) and the CDI specs (PyYAML, from the directory the wrapper passes in
`--yaml-path`).

Its reading is deliberately narrower than the core's (`grants/`, `cdi/`): any shape it does not
expect is a refusal. A refusal is written to runc's `--log` in runc's own JSON form, which the
daemon hands back to the client as the error ("OCI runtime create failed: rdc: ..."), and to the
repo's guard log.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# The runc subcommands after which a process runs in the container with its devices.
GATED = frozenset({"create", "run", "exec", "resume", "restore"})
# runc's global options that take a value (`--root R` or `--root=R`).
_VALUED = frozenset({"--root", "--log", "--log-format", "--criu", "--rootless"})
_SPEC_SUFFIXES = (".yaml", ".json")

Node = tuple[str, str, int, int]  # container path, type (c/b), major, minor


class Refused(Exception):
    """The container may not run: why, and the CDI names that would let it (for the advice). With
    `unhealthy`, the names reach a GPU held back for its health: clearing it, not a grant, helps."""

    def __init__(
        self,
        why: str,
        names: Sequence[str] = (),
        *,
        unhealthy: bool = False,
        suspended: bool = False,
        drained: bool = False,
        stale: bool = False,
    ) -> None:
        super().__init__(why)
        self.names = tuple(names)
        self.unhealthy = unhealthy
        self.suspended = suspended  # the names are granted but suspended: confirm, not grant
        self.drained = drained  # the repo is being emptied for a handover: wait for it
        self.stale = stale  # the specs changed after the inventory: a refresh, not a grant


# --- the command line runc gets ------------------------------------------------------------------


def split_runc_args(args: Sequence[str]) -> tuple[dict[str, str], str, list[str]]:
    """runc's global options, its subcommand ("" when none) and the subcommand's arguments."""
    options: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            return options, arg, list(args[i + 1 :])
        name, eq, value = arg.partition("=")
        if name in _VALUED and not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        options[name] = value
        i += 1
    return options, "", []


def bundle_of(command: str, rest: Sequence[str], state_root: str, cwd: str) -> str:
    """The bundle directory whose config.json describes the container the command acts on."""
    if command in ("create", "run", "restore"):
        for i, arg in enumerate(rest):
            if arg in ("--bundle", "-b") and i + 1 < len(rest):
                return rest[i + 1]
            if arg.startswith("--bundle="):
                return arg.partition("=")[2]
        return cwd
    # exec/resume name a container runc already created: its state records the bundle.
    container = rest[-1] if rest else ""
    if state_root and container and "/" not in container:
        try:
            with open(os.path.join(state_root, container, "state.json"), "rb") as f:
                labels = json.load(f).get("config", {}).get("labels") or []
        except (OSError, ValueError, AttributeError):
            labels = []
        for label in labels:
            if isinstance(label, str) and label.startswith("bundle="):
                return label.partition("=")[2]
    return cwd


def container_nodes(config: Mapping[str, Any]) -> list[Node]:
    """The device nodes an OCI config asks runc to create; Refused when their shape is unexpected."""
    linux = config.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    if devices is None:
        return []
    if not isinstance(devices, list):
        raise Refused("the container's linux.devices is not a list")
    nodes = []
    for device in devices:
        if not isinstance(device, dict) or not isinstance(device.get("path"), str):
            raise Refused("the container has a device entry without a path")
        major, minor = device.get("major", 0), device.get("minor", 0)
        if not isinstance(major, int) or not isinstance(minor, int):
            raise Refused(f"the container's device {device['path']} has no device numbers")
        nodes.append((device["path"], str(device.get("type", "c")), major, minor))
    return nodes


# --- what the repo holds now -----------------------------------------------------------------------


def granted_names(grants_document: Any, repo_id: str, now: float) -> frozenset[str]:
    """The CDI names granted to `repo_id` and in force at `now` (a lease past its end, or a grant
    setup suspended, is absent)."""
    entries = grants_document.get("grants") if isinstance(grants_document, dict) else None
    if not isinstance(entries, list):
        raise Refused("the machine's grants file has no list of grants")
    held = set()
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("device"), str):
            raise Refused("the machine's grants file has an entry without a device")
        if entry.get("repoId") != repo_id:
            continue
        expires = entry.get("expiresAt")
        if expires is not None and (not isinstance(expires, str) or _epoch(expires) <= now):
            continue
        if "suspended" in entry:
            continue
        held.add(entry["device"])
    return frozenset(held)


def suspended_names(grants_document: Any, repo_id: str) -> dict[str, str]:
    """The repo's suspended grants: name -> the drift setup recorded (for the refusal's words)."""
    entries = grants_document.get("grants") if isinstance(grants_document, dict) else None
    found: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else []:
        mine = isinstance(entry, dict) and entry.get("repoId") == repo_id
        if mine and isinstance(entry.get("device"), str):
            mark = entry.get("suspended")
            if mark is not None:
                drift = mark.get("drift") if isinstance(mark, dict) else None
                found[entry["device"]] = drift if isinstance(drift, str) else "suspended"
    return found


def drain_of(grants_document: Any, repo_id: str, now: float) -> str | None:
    """Why the repo is being emptied (`grants.release`: its drain mark, until its bound), or None."""
    marks = grants_document.get("draining") if isinstance(grants_document, dict) else None
    for mark in marks if isinstance(marks, list) else ():
        if not isinstance(mark, dict) or mark.get("repoId") != repo_id:
            continue
        until = mark.get("until")
        if isinstance(until, str) and _epoch(until) > now:
            return f"{mark.get('why', 'hardware is being handed over')} (at most until {until})"
    return None


def drifted_names(grants_document: Any, repo_id: str, inventory_path: str) -> dict[str, str]:
    """The repo's grants whose recorded hardware (`boundTo`) is not what their name reaches in the
    machine's inventory (its devices' `reaches`): name -> how, in words. A grant or an inventory
    that records nothing of it (an older rdc's) is not compared; an inventory that cannot be read
    while a grant must be compared with it refuses (the guard does not guess)."""
    entries = grants_document.get("grants") if isinstance(grants_document, dict) else None
    bound = {
        entry["device"]: entry["boundTo"]
        for entry in (entries if isinstance(entries, list) else [])
        if isinstance(entry, dict)
        and entry.get("repoId") == repo_id
        and isinstance(entry.get("device"), str)
        and isinstance(entry.get("boundTo"), list)
    }
    if not bound:
        return {}
    try:
        with open(inventory_path, "rb") as f:
            devices = json.load(f).get("devices")
    except FileNotFoundError:
        return {}  # never set up: no facts to compare with
    except (OSError, ValueError, AttributeError) as exc:
        raise Refused(f"the machine's inventory cannot be read ({exc})") from exc
    reaches = {
        d["name"]: d["reaches"]
        for d in (devices if isinstance(devices, list) else [])
        if isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("reaches"), list)
    }
    found: dict[str, str] = {}
    for name, was in bound.items():
        now = reaches.get(name)
        if now is not None and sorted(map(unit_key, was)) != sorted(map(unit_key, now)):
            found[name] = f"it was granted on {_units_text(was)} and now reaches {_units_text(now)}"
    return found


def unit_key(entry: Any) -> tuple[Any, ...]:
    """What must stay equal for a recorded unit to be the same hardware: `bindings.UnitIdentity.key`
    on the JSON a grant's `boundTo` and an inventory's `reaches` hold (a test holds the two equal)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("unit"), str):
        raise Refused("a recorded hardware unit has no unit")
    instance = entry.get("instance")
    ids = tuple(sorted(instance.items())) if isinstance(instance, dict) else ()
    uuid, parent = entry.get("uuid"), entry.get("parentUuid")
    if isinstance(uuid, str) and uuid:
        return ("uuid", uuid.lower(), ids)
    if isinstance(parent, str) and parent:
        return ("slice", parent.lower(), entry["unit"].partition("/")[2] or entry["unit"], ids)
    return ("unit", entry["unit"])


def _units_text(entries: list[Any]) -> str:
    words = [
        f"{e.get('uuid') or e.get('unit')}" + (f" at {e['pciBusId']}" if e.get("pciBusId") else "")
        for e in entries
        if isinstance(e, dict)
    ]
    return ", ".join(words) or "no known hardware"


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC stamp as rdc writes them (`...Z`)."""
    import calendar

    try:
        return float(calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return 0.0  # unreadable: expired, so the grant is not used


def _rdev(path: str) -> tuple[str, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    kind = "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else ""
    return (kind, os.major(st.st_rdev), os.minor(st.st_rdev)) if kind else None


def spec_nodes(spec: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], dict[str, list[Mapping[str, Any]]]]:
    """A CDI spec's spec-level device nodes and each device's own, by qualified name."""
    kind = spec.get("kind")
    if not isinstance(kind, str):
        return [], {}

    def nodes_of(edits: Any) -> list[Mapping[str, Any]]:
        found = edits.get("deviceNodes") if isinstance(edits, dict) else None
        return [n for n in found if isinstance(n, dict)] if isinstance(found, list) else []

    shared = nodes_of(spec.get("containerEdits"))
    own: dict[str, list[Mapping[str, Any]]] = {}
    for device in spec.get("devices") or []:
        if isinstance(device, dict) and isinstance(device.get("name"), str):
            own[f"{kind}={device['name']}"] = nodes_of(device.get("containerEdits"))
    return shared, own


def node_of(edit: Mapping[str, Any]) -> Node | None:
    """The node a CDI deviceNode edit makes in the container (numbers from the spec, else the host)."""
    path = edit.get("path")
    if not isinstance(path, str):
        return None
    host_path = edit.get("hostPath")
    host = host_path if isinstance(host_path, str) else path
    kind = edit.get("type") if isinstance(edit.get("type"), str) else ""
    major, minor = edit.get("major"), edit.get("minor")
    if not (isinstance(major, int) and isinstance(minor, int)):
        found = _rdev(host)
        if found is None:
            return None
        kind = kind or found[0]
        major, minor = found[1], found[2]
    return (path, kind or "c", major, minor)


def check(nodes: Iterable[Node], held: frozenset[str], specs: Iterable[Mapping[str, Any]]) -> None:
    """Refused unless every node is one that a CDI device in `held` injects."""
    allowed: set[Node] = set()
    owners: dict[str, set[str]] = {}  # container path -> every name that injects it, for the message
    for spec in specs:
        shared, own = spec_nodes(spec)
        for name, edits in own.items():
            for edit in [*shared, *edits]:
                if isinstance(edit.get("path"), str):
                    owners.setdefault(edit["path"], set()).add(name)
            if name in held:
                allowed.update(n for n in map(node_of, [*shared, *edits]) if n is not None)
    missing = [n for n in nodes if n not in allowed]
    if missing:
        path, kind, major, minor = missing[0]
        names = sorted(owners.get(path, ()))
        which = f" ({' or '.join(names)})" if names else ""
        more = f" and {len(missing) - 1} more device node(s)" if len(missing) > 1 else ""
        raise Refused(
            f"the container holds {path} ({kind} {major}:{minor}){which}{more}, not granted now", names
        )


def check_health(
    nodes: Iterable[Node], held_back: frozenset[str], specs: Iterable[Mapping[str, Any]]
) -> None:
    """Refused when a node is one of a device on a GPU held back for its health (`held_back`: the
    CDI names of those cards, as `rediacc_core.health` records them). A spec's shared nodes
    (a control node) belong to no one card, so they never count."""
    if not held_back:
        return
    owners: dict[Node, set[str]] = {}
    for spec in specs:
        for name, edits in spec_nodes(spec)[1].items():
            if name in held_back:
                for node in filter(None, map(node_of, edits)):
                    owners.setdefault(node, set()).add(name)
    hit = [node for node in nodes if node in owners]
    if hit:
        names = sorted(owners[hit[0]])
        raise Refused(
            f"the container holds {hit[0][0]} ({' or '.join(names)}), a device of a GPU its driver "
            "reported unhealthy",
            names,
            unhealthy=True,
        )


def held_back_names(health_path: str, settings_path: str) -> frozenset[str]:
    """The CDI names on GPUs held back for their health; none when the machine's `gpu-health`
    setting is `report`. Unreadable files: the grants check has passed, so the gate's own check
    (which fails closed) is what stands; the guard does not guess."""
    try:
        with open(settings_path, "rb") as f:
            if json.load(f).get("settings", {}).get("gpu-health") == "report":
                return frozenset()
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with open(health_path, "rb") as f:
            names = json.load(f).get("heldNames", [])
    except (OSError, ValueError, AttributeError):
        return frozenset()
    return frozenset(n for n in names if isinstance(n, str)) if isinstance(names, list) else frozenset()


def stale_specs(cdi_dir: str, inventory_path: str) -> str | None:
    """Why the spec files are not those the inventory was written from (`spec_facts.SpecAge`, the
    gate's rule `stale-facts`), or None. A name may reach other hardware once a spec is rewritten (a
    driver update, two cards that exchanged slots), and the grants were checked against the facts
    of the old one: until `rdc machine refresh` re-checks them, a container with devices does not
    start. Stat only; an inventory that records no specs (an older rdc's) or none at all is not judged."""
    try:
        with open(inventory_path, "rb") as f:
            rows = json.load(f).get("specs")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as exc:
        raise Refused(f"the machine's inventory cannot be read ({exc})") from exc
    if not isinstance(rows, list):
        return None
    then = {
        (r.get("file"), r.get("inode"), r.get("mtimeNs"), r.get("size")) for r in rows if isinstance(r, dict)
    }
    now: set[tuple[Any, ...]] = set()
    try:
        names = [n for n in os.listdir(cdi_dir) if n.endswith(_SPEC_SUFFIXES)]
    except FileNotFoundError:
        names = []
    for name in names:
        path = os.path.join(cdi_dir, name)
        try:
            st = os.stat(path)
        except OSError:
            now.add((name, -1, -1, -1))
            continue
        if not stat.S_ISDIR(st.st_mode):
            now.add((name, st.st_ino, st.st_mtime_ns, st.st_size))
    if now == then:
        return None
    changed = sorted({str(row[0]) for row in now ^ then})
    return (
        f"the CDI specs in {cdi_dir} changed after the machine's inventory was written ({', '.join(changed)})"
    )


def load_specs(cdi_dir: str) -> list[Mapping[str, Any]]:
    """Every spec document in the CDI spec directory (the only one repo daemons read)."""
    try:
        names = sorted(n for n in os.listdir(cdi_dir) if n.endswith(_SPEC_SUFFIXES))
    except FileNotFoundError:
        return []
    documents: list[Mapping[str, Any]] = []
    for name in names:
        path = os.path.join(cdi_dir, name)
        if os.path.isdir(path):
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
            if name.endswith(".json"):
                document = json.loads(data)
            else:
                import yaml

                document = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except Exception:  # a spec the daemon cannot read defines nothing for it either
            continue
        if isinstance(document, dict):
            documents.append(document)
    return documents


# --- running -------------------------------------------------------------------------------------


def decide(opts: Mapping[str, str], runc_args: Sequence[str], cwd: str) -> None:
    """Refused while the repo is being emptied (any container), or when the container runc is about
    to run holds a device node the repo lacks now."""
    options, command, rest = split_runc_args(runc_args)
    if command not in GATED:
        return
    # Every gated start reads the grants file (one small JSON file): a drain mark refuses containers
    # without devices too, since one may take over a descriptor in flight (`grants.release`). Not a
    # resume: a paused container's processes exist already, and the daemon resumes it to stop it.
    try:
        with open(opts["grants"], "rb") as f:
            document = json.load(f)
        unreadable = None
    except FileNotFoundError:
        document, unreadable = {"grants": []}, None
    except (OSError, ValueError) as exc:
        document, unreadable = {"grants": []}, exc
    drained = drain_of(document, opts["repo_id"], time.time()) if command != "resume" else None
    if drained is not None:
        raise Refused(f"the repo is being emptied: {drained}", drained=True)
    bundle = bundle_of(command, rest, options.get("--root", ""), cwd)
    try:
        with open(os.path.join(bundle, "config.json"), "rb") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise Refused(f"cannot read the container's config in {bundle}: {exc}") from exc
    nodes = container_nodes(config if isinstance(config, dict) else {})
    if not nodes:
        return
    if unreadable is not None:
        raise Refused(f"the machine's grants file cannot be read ({unreadable})") from unreadable
    if opts.get("yaml_path"):
        sys.path.append(opts["yaml_path"])
    inventory = opts.get("inventory") or os.path.join(os.path.dirname(opts["grants"]), "inventory.json")
    stale = stale_specs(opts["cdi_dir"], inventory)
    if stale is not None:
        raise Refused(stale, stale=True)
    specs = load_specs(opts["cdi_dir"])
    moved = drifted_names(document, opts["repo_id"], inventory)
    try:
        check(nodes, granted_names(document, opts["repo_id"], time.time()) - moved.keys(), specs)
    except Refused as exc:
        suspended = suspended_names(document, opts["repo_id"])
        hit = [name for name in exc.names if name in suspended]
        if hit:
            why = f"the grant of {hit[0]} is suspended ({suspended[hit[0]]})"
        else:
            hit = [name for name in exc.names if name in moved]
            if not hit:
                raise
            why = f"the grant of {hit[0]} no longer reaches the hardware it was given on ({moved[hit[0]]})"
        raise Refused(f"{exc}: {why}", hit, suspended=True) from None
    if opts.get("health"):
        check_health(nodes, held_back_names(opts["health"], opts.get("settings", "")), specs)


def _report(opts: Mapping[str, str], runc_args: Sequence[str], message: str) -> None:
    options, command, rest = split_runc_args(runc_args)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    log = options.get("--log")
    if log:
        try:
            with open(log, "a") as f:
                f.write(json.dumps({"level": "error", "msg": message, "time": stamp}) + "\n")
        except OSError:
            pass
    if opts.get("guard_log"):
        try:
            with open(opts["guard_log"], "a") as f:
                target = rest[-1] if rest else ""
                f.write(json.dumps({"time": stamp, "runc": command, "container": target, "refused": message}))
                f.write("\n")
        except OSError:
            pass
    print(message, file=sys.stderr)


def parse_own_args(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The guard's own `--key value` options (before `--`) and runc's arguments (after it)."""
    if "--" not in argv:
        raise SystemExit(
            "usage: guard.py --runc PATH --grants FILE --cdi-dir DIR --repo-id ID ... -- RUNC-ARGS"
        )
    split = list(argv).index("--")
    own, runc_args = list(argv[:split]), list(argv[split + 1 :])
    opts = {own[i].lstrip("-").replace("-", "_"): own[i + 1] for i in range(0, len(own) - 1, 2)}
    return opts, runc_args


def main(argv: Sequence[str]) -> int:
    opts, runc_args = parse_own_args(argv)
    try:
        decide(opts, runc_args, os.getcwd())
    except Refused as exc:
        repo = opts.get("repo_ref", "this repo")
        name = exc.names[0] if exc.names else "<name>"
        if exc.drained:
            advice = "start it again once the handover is done"
        elif exc.stale:
            machine = repo.rpartition("@")[2]
            advice = (
                f"an operator can re-check the grants against the new specs (rdc machine refresh {machine})"
            )
        elif exc.suspended:
            advice = (
                f"an operator can accept the hardware it reaches now (rdc repo gpu confirm {repo} --device "
                f"{name}) or revoke it (rdc repo gpu revoke {repo} --device {name})"
            )
        elif exc.unhealthy:
            machine = repo.rpartition("@")[2]
            advice = (
                f"once the card is sound, an operator can clear it (rdc machine gpu clear {machine} --device "
                f"{name}), or remove the container and create it with another GPU"
            )
        else:
            advice = (
                f"an operator can grant the device again (rdc repo gpu grant {repo} --device {name}), or "
                "remove the container and create it without the device"
            )
        _report(opts, runc_args, f"rdc: repo {repo} may not run this container: {exc}; {advice}")
        return 1
    except Exception as exc:  # the guard failing must not let a container through unchecked
        _report(
            opts, runc_args, f"rdc: the runtime guard of repo {opts.get('repo_ref', '?')} failed: {exc!r}"
        )
        return 1
    runc = opts["runc"]
    os.execv(runc, [runc, *runc_args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
