"""NVIDIA's request rules at a repo's gate.

1. GPU device requests that are not CDI (`docker run --gpus`, Compose `gpus:` and
   `deploy.resources.reservations.devices`) and the `nvidia` runtime are refused with the CDI form to
   use instead. The core refuses them generically under the same rule ids; these refusals replace
   that text with the NVIDIA-specific replacement.
2. `NVIDIA_VISIBLE_DEVICES` (and the MIG variables) without a CDI request are a legacy GPU request:
   refused naming the exact CDI names, or, with the machine setting
   `legacy-visible-devices: translate`, rewritten into those CDI names (whose grants the core checks).
3. `NVIDIA_REQUIRE_*` from the request and the image are evaluated against every requested GPU, as
   the NVIDIA runtime did before CDI made it skip them.
4. `NVIDIA_DRIVER_CAPABILITIES` is admitted; a log line says when it asks for driver parts the
   machine's spec does not carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rediacc_core import ApiRequest, GateContext, Gpu, Refusal, Rewrite, Verdict
from rediacc_nvidia import names
from rediacc_nvidia.capabilities import capability_note
from rediacc_nvidia.lookup import label, nvidia_gpus, resolve
from rediacc_nvidia.require import (
    CUDA_ADVICE,
    GpuFacts,
    RequirementError,
    Term,
    collect,
    environment,
    evaluate,
)
from rediacc_nvidia.visible import VisibleDevicesError, cdi_names, legacy_requests

RULE_DEVICE_REQUEST = "device-request-driver"
RULE_RUNTIME = "runtime"
RULE_VISIBLE = "nvidia-visible-devices"
RULE_REQUIRE = "nvidia-require"
TRANSLATE_SETTING = "legacy-visible-devices"

_COMPOSE_ALL = "devices: [nvidia.com/gpu=all]"
_ENV_ONLY = "NVIDIA_REQUIRE_* decided on the request's Env only"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def replacement_for(cdi: list[str]) -> str:
    """What to write instead, for `docker run` and for Compose.

    Compose's short `devices:` syntax splits on `:`, so a MIG index name (`0:1`) needs the long
    syntax there, or the MIG device's UUID name.
    """
    flags = " ".join(f"--device {name}" for name in cdi)
    compose = f"devices: [{', '.join(cdi)}]"
    if any(":" in (names.device_part(name) or "") for name in cdi):
        compose += " in the long syntax (the short one splits on ':'), or the MIG-<uuid> names"
    return f"docker run {flags} (Compose: {compose})"


def usable_replacement(wanted: list[str], ctx: GateContext | None) -> str:
    """The replacement this repo can use now: the names asked when it holds them all; else the
    NVIDIA names it holds (a request for `all` GPUs is all of those); else, when another repo's
    exclusive grant is in the way, who holds it and the handover; else the grant to ask for.

    Without a context (a caller outside a gate), the names asked, as before."""
    if ctx is None:
        return replacement_for(wanted)
    held = sorted(name for name in ctx.grants if name.startswith(names.PREFIX))
    if all(name in ctx.grants for name in wanted):
        return replacement_for(wanted)
    if held:
        mine = replacement_for(held)
        return f"{mine}: the GPUs this repo holds ({', '.join(wanted)} is not granted to it)"
    for name in wanted:
        blocked = None if name in ctx.grants else ctx.in_the_way(name)
        if blocked is not None:  # a grant to ask for would be refused: who holds it, and the handover
            others = " ".join(f"--device {g}" for g in sorted(ctx.grants))
            what_it_has = f"; what it holds: {others}" if others else ""
            return f"no NVIDIA GPU: {name} cannot be granted to this repo now: {blocked}{what_it_has}"
    devices = " ".join(f"--device {name}" for name in wanted)
    return (
        f"{replacement_for(wanted)} once an operator grants it: rdc repo gpu grant {ctx.repo_ref} {devices} "
        "(this repo holds no GPU now)"
    )


# --- 1. non-CDI device requests and the nvidia runtime ----------------------------------------------


def _is_nvidia_driver(driver: str) -> bool:
    # "" is what `--gpus` and Compose `gpus:` send: the daemon picks NVIDIA's driver by capability.
    return driver == "" or driver.lower() == "nvidia" or driver.lower().startswith("nvidia.")


def _names_for_ids(device_ids: Any) -> list[str]:
    ids = (
        [str(item).strip() for item in device_ids if str(item).strip()]
        if isinstance(device_ids, list)
        else []
    )
    cdi = [names.qualified(item) for item in ids if names.is_device_name(item)]
    return cdi if cdi and len(cdi) == len(ids) else [names.ALL]


def device_request_refusals(host_config: Mapping[str, Any], ctx: GateContext | None = None) -> list[Verdict]:
    verdicts: list[Verdict] = []
    requests = host_config.get("DeviceRequests")
    for entry in requests if isinstance(requests, list) else []:
        request = _mapping(entry)
        raw_driver = request.get("Driver")
        driver = raw_driver if isinstance(raw_driver, str) else ""
        if driver == "cdi" or not _is_nvidia_driver(driver):
            continue
        shown = (
            f"a GPU device request with driver {driver!r}"
            if driver
            else "--gpus (or Compose gpus: / deploy.resources.reservations.devices)"
        )
        verdicts.append(
            Refusal(
                message=f"{shown} is refused: GPUs reach a repo only as granted CDI devices",
                replacement=usable_replacement(_names_for_ids(request.get("DeviceIDs")), ctx),
                rule=RULE_DEVICE_REQUEST,
                subject=driver or "--gpus",  # as the core's `device-request-driver` names it
            )
        )
    return verdicts


def runtime_refusal(host_config: Mapping[str, Any], ctx: GateContext | None = None) -> list[Verdict]:
    runtime = host_config.get("Runtime")
    if not isinstance(runtime, str) or not runtime.lower().startswith("nvidia"):
        return []
    return [
        Refusal(
            message=(
                f"runtime {runtime!r} is refused: containers here run with runc, and a GPU comes from a "
                "granted CDI device"
            ),
            replacement=(
                f"{_COMPOSE_ALL} in Compose, not runtime: (docker run --device {names.ALL})"
                if ctx is None
                else f"no runtime: {usable_replacement([names.ALL], ctx)}"
            ),
            rule=RULE_RUNTIME,
            subject=runtime,
        )
    ]


# --- 2. NVIDIA_VISIBLE_DEVICES without CDI ------------------------------------------------------------


def legacy_visible(
    env: Mapping[str, str], gpus: list[Gpu], settings: Mapping[str, Any], ctx: GateContext | None = None
) -> tuple[list[Verdict], list[str]]:
    """Verdicts for the legacy variables, and the CDI names they were translated to (if they were)."""
    try:
        requests = legacy_requests(env)
        wanted: list[str] = []
        for request in requests:
            for name in cdi_names(request, gpus):
                if name not in wanted:
                    wanted.append(name)
    except VisibleDevicesError as exc:
        return [
            Refusal(
                message=str(exc),
                replacement=f"docker run --device {names.PREFIX}<name> (`rdc machine gpu list` shows them)",
                status=400,
                rule=RULE_VISIBLE,
            )
        ], []
    if not wanted:
        return [], []  # none, void or empty: not asking for a GPU
    if names.ALL in wanted:
        wanted = [names.ALL]
    shown = ", ".join(f"{r.variable}={r.value}" for r in requests if r.state == "devices")
    if settings.get(TRANSLATE_SETTING) == "translate":
        return [
            Rewrite(
                description=f"{shown} translated to CDI devices {', '.join(wanted)}",
                add_cdi_devices=tuple(wanted),
                remove_env=tuple(r.variable for r in requests),
            )
        ], wanted
    return [
        Refusal(
            message=(
                f"{shown} asks for GPUs the way the old NVIDIA runtime did, which runc ignores; "
                "GPUs reach a repo only as granted CDI devices"
            ),
            replacement=usable_replacement(wanted, ctx),
            rule=RULE_VISIBLE,
        )
    ], []


# --- 3. NVIDIA_REQUIRE_* ------------------------------------------------------------------------------


def _image_env(body: Mapping[str, Any], ctx: GateContext) -> dict[str, str] | None:
    image = body.get("Image")
    if not isinstance(image, str) or not image:
        return {}
    try:
        config = ctx.image_config(image)
    except Exception as exc:  # the daemon's trouble must never become the gate's crash
        ctx.log(f"nvidia: inspecting image {image!r} failed ({exc}); {_ENV_ONLY}")
        return None
    if config is None:
        ctx.log(f"nvidia: image {image!r} could not be inspected; {_ENV_ONLY}")
        return None
    env = config.get("Env")
    if env is None and isinstance(config.get("Config"), Mapping):
        env = config["Config"].get("Env")  # a whole inspect answer rather than its Config
    return environment(env if isinstance(env, list) else [])


def requested_gpus(cdi: list[str], gpus: list[Gpu], ctx: GateContext) -> list[Gpu]:
    """The whole GPUs behind the requested names (a MIG device stands for its GPU's driver facts)."""
    chosen: list[Gpu] = []
    for name in cdi:
        if name == names.ALL:
            found = list(gpus)
        else:
            hit = resolve(name, gpus)
            if hit is None:
                ctx.log(
                    f"nvidia: {name} is not in the machine's inventory; its NVIDIA_REQUIRE_* are not checked"
                )
                continue
            found = [hit[0]]
        chosen += [gpu for gpu in found if gpu not in chosen]
    return chosen


def _facts(gpu: Gpu) -> GpuFacts:
    def text(key: str) -> str | None:
        value = gpu.attributes.get(key)
        return str(value) if value is not None else None

    return GpuFacts(
        label(gpu), text("cudaDriverVersion"), gpu.driver_version, text("computeCapability"), text("brand")
    )


def _unsatisfied(variable: str, facts: GpuFacts, term: Term | None) -> Refusal:
    condition = term.text if term is not None else "(no alternative holds)"
    advice = f", {CUDA_ADVICE}" if term is not None and term.wants_newer_cuda else ""
    return Refusal(
        message=(
            f"{facts.label}: unsatisfied condition: {condition}{advice} ({variable}; the GPU has CUDA "
            f"driver version {facts.cuda or 'unknown'}, driver {facts.driver or 'unknown'}, compute "
            f"capability {facts.arch or 'unknown'}, brand {facts.brand or 'unknown'}). Use an image this "
            "machine's driver supports, or set NVIDIA_DISABLE_REQUIRE=true to start it anyway"
        ),
        rule=RULE_REQUIRE,
    )


def requirement_refusals(env: Mapping[str, str], targets: list[Gpu], ctx: GateContext) -> list[Verdict]:
    try:
        requirements = collect(env)
    except RequirementError as exc:
        # 400: the request (or its image) states something that is not an expression at all.
        return [
            Refusal(
                message=f"malformed requirement: {exc}; fix it, or set NVIDIA_DISABLE_REQUIRE=true",
                status=400,
                rule=RULE_REQUIRE,
            )
        ]
    if requirements and not targets:
        ctx.log("nvidia: no requested GPU is in the machine's inventory; NVIDIA_REQUIRE_* not checked")
    verdicts: list[Verdict] = []
    for requirement in requirements:
        for gpu in targets:
            facts = _facts(gpu)
            outcome = evaluate(requirement, facts)
            if outcome.holds is False:
                verdicts.append(_unsatisfied(requirement.variable, facts, outcome.failed))
                break
            if outcome.holds is None:
                ctx.log(
                    f"nvidia: {requirement.variable} could not be checked for {facts.label}: "
                    "the inventory lacks a fact it needs"
                )
    return verdicts


# --- the hook -------------------------------------------------------------------------------------------


def request_rules(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
    if not request.is_container_create or not isinstance(request.body, Mapping):
        return []
    body = request.body
    host_config = _mapping(body.get("HostConfig"))
    verdicts = device_request_refusals(host_config, ctx) + runtime_refusal(host_config, ctx)

    raw_env = body.get("Env")
    request_env = environment(raw_env if isinstance(raw_env, list) else [])
    requested = [name for name in request.cdi_devices if name.startswith(names.PREFIX)]
    gpus = nvidia_gpus(ctx.inventory)
    if not requested:
        legacy, translated = legacy_visible(request_env, gpus, ctx.settings, ctx)
        verdicts += legacy
        requested = translated
    if not requested:
        return verdicts

    image_env = _image_env(body, ctx)
    env = {**(image_env or {}), **request_env}  # the container's Env overrides the image's, as in Docker
    verdicts += requirement_refusals(env, requested_gpus(requested, gpus, ctx), ctx)
    note = capability_note(env, ctx.machine)
    if note:
        ctx.log(note)
    return verdicts
