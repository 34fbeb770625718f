"""CDI spec files: load (`.yaml`/`.json`), validate strictly, write atomically.

Validation is the shipped JSON Schema (shape, unknown fields, KEY=VALUE env, permissions, hook
names) followed by the checks a schema cannot express: which `cdiVersion` each used feature needs,
duplicate device names, devices whose edits are all empty. Every problem is reported as
`at <JSON path>: <what is wrong>` inside a message that names the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from rediacc_core.cdi.names import device_name_problem, kind_problem
from rediacc_core.errors import NotFoundError, ValidationError
from rediacc_core.files import atomic_write_text

SCHEMA_NAME = "cdi-spec.schema.json"
SPEC_SUFFIXES = (".yaml", ".json")  # what the reference loader reads; `.yml` is not among them
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
_MAX_PROBLEMS_SHOWN = 8
_EDIT_LISTS = ("env", "deviceNodes", "mounts", "hooks", "additionalGids", "netDevices")
# BuildKit (Engine 28's builder) lets every build step have a device whose spec or entry carries
# this annotation, with no entitlement: in a repo daemon, any repo's build, whatever its grants.
BUILDKIT_AUTOALLOW = "org.mobyproject.buildkit.device.autoallow"


class CdiSpecError(ValidationError):
    """A spec that cannot be used; `problems` are `at <JSON path>: <why>` lines."""

    def __init__(self, source: str, problems: Sequence[str], todo: str = "") -> None:
        shown = list(problems[:_MAX_PROBLEMS_SHOWN])
        if len(problems) > len(shown):
            shown.append(f"and {len(problems) - len(shown)} more")
        super().__init__(
            f"invalid CDI spec {source}: " + "; ".join(shown),
            todo
            or f"fix {source} (or regenerate it with the tool that wrote it); until then its devices "
            "cannot be used",
        )
        self.source = source
        self.problems = list(problems)


@dataclass(frozen=True)
class Spec:
    """A validated spec. `raw` is the document as loaded; treat it as read-only."""

    path: Path | None
    version: str
    kind: str
    device_names: tuple[str, ...]
    raw: Mapping[str, Any] = field(hash=False)  # equal specs hash alike; the document is not hashable

    @property
    def source(self) -> str:
        return str(self.path) if self.path is not None else "<document>"

    def qualified_names(self) -> list[str]:
        return [f"{self.kind}={name}" for name in self.device_names]

    def device(self, name: str) -> Mapping[str, Any]:
        """The `devices[]` entry called `name`; NotFoundError when this spec does not define it."""
        for entry in self.raw["devices"]:
            if entry["name"] == name:
                found: Mapping[str, Any] = entry
                return found
        raise NotFoundError(
            f"{self.kind}={name} is not defined in {self.source}",
            f"use one of: {', '.join(self.qualified_names())}",
        )


def device_nodes(spec: Spec, device_name: str) -> list[Mapping[str, Any]]:
    """Every device node that requesting `device_name` injects: the spec-level ones, then its own."""
    device = spec.device(device_name)
    spec_level = spec.raw.get("containerEdits", {}).get("deviceNodes", [])
    own = device["containerEdits"].get("deviceNodes", [])
    return [*spec_level, *own]


# --- validation ------------------------------------------------------------------------------


@cache
def schema() -> dict[str, Any]:
    """The strict CDI spec schema shipped in this package."""
    text = resources.files("rediacc_core.cdi").joinpath("schema", SCHEMA_NAME).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _end_anchored(pattern: str) -> str:
    """`pattern` with each `$` anchor written `\\Z`.

    JSON Schema patterns are ECMA-262, where `$` is the end of the text; Python's `$` also matches
    before a final newline, which would admit `vendor.com/gpu\\n` as a kind the daemon's loader
    refuses. (`$` inside a character class or escaped does not occur in the shipped schema.)
    """
    out = []
    for index, char in enumerate(pattern):
        escaped = index > 0 and pattern[index - 1] == "\\"
        out.append("\\Z" if char == "$" and not escaped else char)
    return "".join(out)


def _python_patterns(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: _end_anchored(item) if key == "pattern" and isinstance(item, str) else _python_patterns(item)
            for key, item in node.items()
        }
    if isinstance(node, list):
        return [_python_patterns(item) for item in node]
    return node


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_python_patterns(schema()))


def _without_nulls(value: Any, annotations: bool = False) -> Any:
    """The document as the daemon's loader reads it: a YAML/JSON `null` field is the field left out.

    Go decodes `containerEdits:` or `env: null` to the zero value, so the spec loads there; a null
    annotation value is the empty string. Nulls inside lists stay, and are refused as wrong types.
    """
    if isinstance(value, dict):
        if annotations:
            return {key: "" if item is None else item for key, item in value.items()}
        return {
            key: _without_nulls(item, annotations=key == "annotations")
            for key, item in value.items()
            if item is not None
        }
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _show(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _fields(names: Sequence[Any]) -> str:
    shown = ", ".join(f'"{name}"' for name in names)
    return f"field {shown}" if len(names) == 1 else f"fields {shown}"


def _schema_problem(err: jsonschema.ValidationError) -> str:
    """One schema failure as `at <path>: <why>`, in words an operator can act on."""
    sub = err.schema if isinstance(err.schema, Mapping) else {}
    hint = sub.get("x-problem")
    value = err.instance
    where = err.json_path
    if err.validator == "additionalProperties" and isinstance(value, Mapping):
        known = sorted(sub.get("properties", {}))
        unknown = [key for key in value if key not in known]
        return f"at {where}: unknown {_fields(unknown)} (known fields: {', '.join(known)})"
    if err.validator == "required" and isinstance(err.validator_value, list) and isinstance(value, Mapping):
        missing = [key for key in err.validator_value if key not in value]
        return f"at {where}: missing required {_fields(missing)}"
    if err.validator == "type" and err.validator_value == "string" and type(value) in (int, float):
        # YAML reads `name: 0` or `cdiVersion: 1.0` as numbers; the fix is quoting.
        return f'at {where}: {value!r} is a number, not a string; quote it ("{value}")'
    if err.validator == "pattern" and hint == "kind":
        return f"at {where}: kind {_show(value)} {kind_problem(str(value)) or 'is not vendor/class'}"
    if err.validator == "pattern" and hint == "device-name":
        why = device_name_problem(str(value)) or "is not a valid device name"
        return f"at {where}: device name {_show(value)} {why}"
    if err.validator in ("pattern", "enum") and hint:
        extra = ""
        if err.validator == "enum" and isinstance(err.validator_value, list):
            extra = f" (expected one of: {', '.join(map(str, err.validator_value))})"
        return f"at {where}: {_show(value)} {hint}{extra}"
    if err.validator in ("minItems", "minProperties") and hint:
        return f"at {where}: {hint}"
    return f"at {where}: {err.message}"


def _edits_of(document: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every containerEdits block with its JSON path, spec-level first."""
    if "containerEdits" in document:
        yield "$.containerEdits", document["containerEdits"]
    for index, device in enumerate(document["devices"]):
        yield f"$.devices[{index}].containerEdits", device["containerEdits"]


def _feature_uses(document: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(minimum cdiVersion, JSON path, what) for every use of a feature newer than 0.3.0.

    The same features, with the same "set means used" reading, as the reference implementation's
    minimum-version rules, so a spec we accept is one the daemon accepts.
    """
    if document.get("annotations"):
        yield "0.6.0", "$.annotations", "annotations"
    cls = document["kind"].partition("/")[2]
    if "." in cls:
        yield "0.6.0", "$.kind", f'a "." in the class ("{cls}")'
    for index, device in enumerate(document["devices"]):
        if device["name"][:1].isdigit():
            yield (
                "0.5.0",
                f"$.devices[{index}].name",
                f'a device name starting with a digit ("{device["name"]}")',
            )
        if device.get("annotations"):
            yield "0.6.0", f"$.devices[{index}].annotations", "annotations"
    for where, edits in _edits_of(document):
        for n, mount in enumerate(edits.get("mounts", [])):
            if mount.get("type"):
                yield "0.4.0", f"{where}.mounts[{n}].type", "mounts[].type"
        for n, node in enumerate(edits.get("deviceNodes", [])):
            if node.get("hostPath"):
                yield "0.5.0", f"{where}.deviceNodes[{n}].hostPath", "deviceNodes[].hostPath"
        if "intelRdt" in edits:
            yield "0.7.0", f"{where}.intelRdt", "intelRdt"
            rdt = edits["intelRdt"]
            for key in ("schemata", "enableMonitoring"):
                if rdt.get(key):
                    yield "1.1.0", f"{where}.intelRdt.{key}", f"intelRdt.{key}"
        if edits.get("additionalGids"):
            yield "0.7.0", f"{where}.additionalGids", "additionalGids"
        if edits.get("netDevices"):
            yield "1.1.0", f"{where}.netDevices", "netDevices"


def autoallow_problems(document: Any) -> list[str]:
    """Where `document` (a spec, read leniently) hands its devices to every BuildKit build step."""
    if not isinstance(document, Mapping):
        return []
    holders = [("$", document)]
    devices = document.get("devices")
    if isinstance(devices, list):
        holders += [(f"$.devices[{i}]", d) for i, d in enumerate(devices) if isinstance(d, Mapping)]
    return [
        f"at {where}.annotations: {BUILDKIT_AUTOALLOW} is refused: BuildKit would give the device to "
        "every build step of every repo, whatever its grants; remove the annotation"
        for where, holder in holders
        if isinstance(holder.get("annotations"), Mapping) and BUILDKIT_AUTOALLOW in holder["annotations"]
    ]


def _semantic_problems(document: Mapping[str, Any]) -> list[str]:
    """What the schema cannot say: duplicate names, devices that edit nothing, version gates, and
    BuildKit's auto-allow annotation."""
    problems: list[str] = autoallow_problems(document)
    first_seen: dict[str, int] = {}
    for index, device in enumerate(document["devices"]):
        name = device["name"]
        if name in first_seen:
            problems.append(
                f'at $.devices[{index}].name: duplicate device name "{name}" '
                f"(already defined at $.devices[{first_seen[name]}])"
            )
        else:
            first_seen[name] = index
        edits = device["containerEdits"]
        if "intelRdt" not in edits and not any(edits.get(key) for key in _EDIT_LISTS):
            problems.append(
                f"at $.devices[{index}].containerEdits: a device needs at least one container edit"
            )
    declared = document["cdiVersion"]
    needed = declared
    for minimum, where, what in _feature_uses(document):
        if _version_key(minimum) > _version_key(declared):
            problems.append(
                f"at {where}: {what} needs cdiVersion {minimum} or later, but the spec says {declared}"
            )
            needed = max(needed, minimum, key=_version_key)
    if needed != declared:
        problems.append(f'at $.cdiVersion: raise it to "{needed}", the newest version a used feature needs')
    return problems


def _spec_problems(document: Any) -> list[str]:
    if not isinstance(document, Mapping):
        kind = "empty" if document is None else f"a {type(document).__name__}, not a mapping"
        return [f"at $: the document is {kind}"]
    errors = sorted(_validator().iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        # The checks below assume the schema's shape; report shape problems first.
        # dict.fromkeys: one "missing fields" line per object even though each field is its own error.
        return list(dict.fromkeys(_schema_problem(err) for err in errors))
    return _semantic_problems(document)


def _validated(document: Any, source: str, path: Path | None, todo: str = "") -> Spec:
    document = _without_nulls(document)
    problems = _spec_problems(document)
    if problems:
        raise CdiSpecError(source, problems, todo)
    return Spec(
        path=path,
        version=document["cdiVersion"],
        kind=document["kind"],
        device_names=tuple(device["name"] for device in document["devices"]),
        raw=document,
    )


def validate_spec(document: Any, source: str) -> Spec:
    """Check an in-memory spec document; `source` names it in errors (a file, a plugin).

    The returned spec holds a copy made of dicts and lists, so a plugin may build its document
    from tuples and later changes to `document` do not leak into the spec.
    """
    return _validated(_plain(document), source, None)


# --- reading and writing ---------------------------------------------------------------------


class _DuplicateKeyError(ValueError):
    pass


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A repeated key is read differently by different parsers; a spec the gate reads one way and
    # the daemon another must never load.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(f"duplicate key {json.dumps(key)}")
        result[key] = value
    return result


_YamlBase: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictYamlLoader(_YamlBase):  # type: ignore[valid-type,misc]
    """Safe YAML that refuses duplicate keys, non-string keys and merge keys (`<<`)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(
                    None, None, "merge keys (<<) are not allowed in a CDI spec", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"mapping key {key!r} is not a string", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {json.dumps(key)}", key_node.start_mark
                )
            seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _format_of(path: Path) -> str:
    suffix = path.suffix
    if suffix not in SPEC_SUFFIXES:
        raise CdiSpecError(
            str(path),
            [f'a CDI spec file name ends in .yaml or .json, not "{suffix or "(no suffix)"}"'],
            "rename the file: the CDI loader ignores other names (.yml included)",
        )
    return suffix[1:]


def parse_spec_text(text: str, fmt: str, source: str) -> Any:
    """The document in `text` (`fmt` "yaml" or "json"), or CdiSpecError saying where it breaks."""
    try:
        if fmt == "json":
            return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
        return yaml.load(text, Loader=_StrictYamlLoader)
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    except _DuplicateKeyError as exc:
        problem = f"not a usable JSON document: {exc}"
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        place = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = f"not valid YAML ({place}{exc.problem})"
    except yaml.YAMLError as exc:
        problem = f"not valid YAML ({exc})"
    except RecursionError:
        problem = "nested too deeply to be a CDI spec"
    raise CdiSpecError(source, [problem])


def autoallowed_specs(directory: Path) -> list[str]:
    """One line per spec file in `directory` that BuildKit would auto-allow (see
    `autoallow_problems`); files that cannot be read or parsed are left to the loader's errors."""
    found: list[str] = []
    try:
        paths = sorted(p for p in directory.iterdir() if p.suffix in SPEC_SUFFIXES)
    except OSError:
        return found
    for path in paths:
        try:
            document = parse_spec_text(path.read_text(encoding="utf-8"), path.suffix[1:], str(path))
        except (OSError, UnicodeDecodeError, CdiSpecError):
            continue
        found += [f"{path}: {problem}" for problem in autoallow_problems(document)]
    return found


def load_spec(path: Path) -> Spec:
    """Read and validate one spec file (YAML or JSON by its extension)."""
    path = Path(path)
    fmt = _format_of(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CdiSpecError(str(path), [f"cannot read it: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        raise CdiSpecError(str(path), [f"not UTF-8 text (byte {exc.start})"]) from exc
    return _validated(parse_spec_text(text, fmt, str(path)), str(path), path)


def _plain(value: Any) -> Any:
    """A copy made of dicts and lists only, which both serialisers accept."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def dump_spec(document: Mapping[str, Any], path: Path) -> str:
    """The text of `document` for `path`: YAML for `.yaml`, JSON for `.json`."""
    plain = _plain(document)
    if _format_of(Path(path)) == "json":
        return json.dumps(plain, indent=2) + "\n"
    dumped: str = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return dumped


def write_spec(path: Path, document: Mapping[str, Any]) -> Spec:
    """Validate `document`, then replace `path` atomically; an invalid document writes nothing."""
    path = Path(path)
    keep = f"nothing was written; {path} is unchanged. Fix the spec document and write it again"
    fmt = _format_of(path)
    plain = _without_nulls(_plain(document))
    spec = _validated(plain, str(path), path, keep)
    text = dump_spec(plain, path)
    # Read our own output back: a serialiser quirk must fail here, not in the daemon.
    if parse_spec_text(text, fmt, str(path)) != plain:
        raise CdiSpecError(str(path), ["the serialised spec does not read back as the same document"], keep)
    atomic_write_text(path, text)
    return spec
