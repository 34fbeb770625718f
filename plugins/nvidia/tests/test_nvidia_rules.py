"""The gate's NVIDIA rules on canonical container-create bodies built by hand."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from rediacc_nvidia.require import CUDA_ADVICE
from rediacc_nvidia.rules import request_rules

from rediacc_core import ApiRequest, GateContext, Gpu, GpuPartition, Inventory, Refusal, Rewrite
from rediacc_core.gate.decide.decision import merge_refusals
from rediacc_core.gate.policy import mounts, rules
from rediacc_core.machine import Machine

G0 = "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"
M1 = "MIG-00000001-0000-0000-0000-000000000001"
CUDA_12_IMAGE = (
    "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
    "brand=nvidia,driver>=535,driver<536"
)


def _gpus() -> list[Gpu]:
    return [
        Gpu(
            vendor="nvidia",
            source="nvidia",
            name="NVIDIA A100-SXM4-40GB",
            index=0,
            pci_bus_id="0000:00:04.0",
            driver="nvidia",
            driver_version="510.47.03",
            memory_mib=40960,
            cdi_names=("nvidia.com/gpu=0", f"nvidia.com/gpu={G0}"),
            attributes={
                "uuid": G0,
                "cudaDriverVersion": "11.6",
                "computeCapability": "8.0",
                "brand": "NVIDIA",
                "migMode": "Enabled",
            },
            partitions=(
                GpuPartition(
                    index=1,
                    uuid=M1,
                    profile="3g.20gb",
                    memory_mib=19968,
                    cdi_names=("nvidia.com/gpu=0:1", f"nvidia.com/gpu={M1}"),
                    attributes={"gpuInstanceId": 2, "computeInstanceId": 0},
                ),
            ),
        ),
        Gpu(
            vendor="nvidia",
            source="nvidia",
            name="NVIDIA GeForce RTX 4090",
            index=1,
            pci_bus_id="0000:84:00.0",
            driver="nvidia",
            driver_version="510.47.03",
            memory_mib=24564,
            cdi_names=("nvidia.com/gpu=1",),
            attributes={"cudaDriverVersion": "11.6", "computeCapability": "8.9", "brand": "GeForce"},
        ),
    ]


class Gate:
    """A GateContext built directly, with an image store and a log to look at."""

    def __init__(self, inventory: Inventory | None, tmp_path: Path) -> None:
        self.images: dict[str, Mapping[str, Any] | None] = {}
        self.lines: list[str] = []
        self.settings: dict[str, Any] = {}
        self.blocked: dict[str, str] = {}  # what another repo's exclusive grant keeps from this one
        self.machine = Machine("m1", tmp_path / "root")
        self.inventory = inventory
        self.grants: frozenset[str] = frozenset(
            {"nvidia.com/gpu=0", f"nvidia.com/gpu={G0}", "nvidia.com/gpu=all"}
        )

    def context(self) -> GateContext:
        def image_config(image: str) -> Mapping[str, Any] | None:
            if image == "broken:latest":
                raise ConnectionError("upstream daemon hung up")
            return self.images.get(image)

        return GateContext(
            repo_name="alpha",
            repo_ref="alpha@m1",
            machine=self.machine,
            grants=self.grants,
            inventory=self.inventory,
            settings=self.settings,
            image_config=image_config,
            log=self.lines.append,
            in_the_way=lambda name: self.blocked.get(name),
        )

    def decide(self, body: dict[str, Any], cdi: tuple[str, ...] = ()) -> list[Refusal | Rewrite]:
        request = ApiRequest("POST", "/containers/create", {}, body, "1.45", cdi)
        return request_rules(request, self.context())


@pytest.fixture
def gate(inventory_of: Callable[..., Inventory], tmp_path: Path) -> Gate:
    return Gate(inventory_of(_gpus()), tmp_path)


def create(env: list[str] | None = None, image: str = "cuda:12.2", **host: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"Image": image, "Env": env or [], "HostConfig": host}
    return body


def only_refusal(verdicts: list[Refusal | Rewrite]) -> Refusal:
    assert len(verdicts) == 1 and isinstance(verdicts[0], Refusal), verdicts
    return verdicts[0]


# --- non-CDI GPU requests ----------------------------------------------------------------------------


def test_gpus_all_is_refused_with_the_cdi_form(gate: Gate) -> None:
    body = create(DeviceRequests=[{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]]}])
    refusal = only_refusal(gate.decide(body))
    assert refusal.rule == "device-request-driver" and refusal.status == 403
    assert "--gpus" in refusal.message
    assert refusal.replacement is not None and "--device nvidia.com/gpu=all" in refusal.replacement


def test_gpus_device_list_names_each_device(gate: Gate) -> None:
    body = create(
        DeviceRequests=[{"Driver": "nvidia", "Count": 0, "DeviceIDs": ["0", G0], "Capabilities": [["gpu"]]}]
    )
    refusal = only_refusal(gate.decide(body))
    assert "driver 'nvidia'" in refusal.message
    assert refusal.replacement == (
        f"docker run --device nvidia.com/gpu=0 --device nvidia.com/gpu={G0} "
        f"(Compose: devices: [nvidia.com/gpu=0, nvidia.com/gpu={G0}])"
    )


def test_cdi_requests_and_other_vendors_drivers_are_not_ours(gate: Gate) -> None:
    body = create(DeviceRequests=[{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=0"]}, {"Driver": "amd"}])
    assert gate.decide(body, ("nvidia.com/gpu=0",)) == []


def test_nvidia_runtime_is_refused_with_compose_devices(gate: Gate) -> None:
    refusal = only_refusal(gate.decide(create(Runtime="nvidia")))
    assert refusal.rule == "runtime" and "'nvidia'" in refusal.message
    assert refusal.replacement is not None and "devices: [nvidia.com/gpu=all]" in refusal.replacement
    assert gate.decide(create(Runtime="runc")) == []


@pytest.mark.parametrize(
    "host",
    [
        {"DeviceRequests": [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]},  # --gpus all
        {"DeviceRequests": [{"Driver": "nvidia", "Count": 1}]},
        {"Runtime": "nvidia"},
    ],
)
def test_each_refusal_replaces_the_cores_about_the_same_value(gate: Gate, host: dict[str, Any]) -> None:
    binds = mounts.BindPolicy(files_dir="/files", roots=(), never=(), volume_drivers=frozenset(), pins=None)
    core = list(rules.container_create(create(**host), rules.RuleContext("alpha@m1", binds)))
    ours = only_refusal(gate.decide(create(**host)))
    assert [(f.refusal.rule, f.subject) for f in core] == [(ours.rule, ours.subject)]
    assert merge_refusals(core, [ours]) == [ours]


# The advice names what this repo can use now (a refusal's replacement must not be refused in turn).
ADVICE = [
    # (the repo's grants, what it asked for, what it is told to use)
    (
        {"nvidia.com/gpu=0"},
        {"Driver": "", "Count": -1},  # --gpus all
        "docker run --device nvidia.com/gpu=0 (Compose: devices: [nvidia.com/gpu=0]): the GPUs this repo "
        "holds (nvidia.com/gpu=all is not granted to it)",
    ),
    (
        {"nvidia.com/gpu=all"},
        {"Driver": "", "Count": -1},
        "docker run --device nvidia.com/gpu=all (Compose: devices: [nvidia.com/gpu=all])",
    ),
    (
        set(),
        {"Driver": "", "DeviceIDs": ["0"]},  # --gpus device=0, in a repo holding no GPU
        "docker run --device nvidia.com/gpu=0 (Compose: devices: [nvidia.com/gpu=0]) once an operator grants "
        "it: rdc repo gpu grant alpha@m1 --device nvidia.com/gpu=0 (this repo holds no GPU now)",
    ),
    (
        {"rediacc.io/dri=renderD128"},  # another vendor's grant is no NVIDIA GPU to suggest
        {"Driver": "nvidia", "Count": 1},
        "docker run --device nvidia.com/gpu=all (Compose: devices: [nvidia.com/gpu=all]) once an operator "
        "grants it: rdc repo gpu grant alpha@m1 --device nvidia.com/gpu=all (this repo holds no GPU now)",
    ),
]


@pytest.mark.parametrize(("grants", "request_", "told"), ADVICE)
def test_the_advice_names_what_this_repo_can_use(
    gate: Gate, grants: set[str], request_: dict[str, Any], told: str
) -> None:
    gate.grants = frozenset(grants)
    refusal = only_refusal(gate.decide(create(DeviceRequests=[{**request_, "Capabilities": [["gpu"]]}])))
    assert refusal.replacement == told


def test_gpus_all_in_a_repo_with_only_a_render_node_names_who_holds_the_cards(gate: Gate) -> None:
    # Another repo holds the cards exclusively: a grant of nvidia.com/gpu=all would be refused, so
    # the advice is who holds them and the handover, never that grant.
    held = (
        "repo beta@m1 holds nvidia.com/gpu=0 exclusively (to move it in one step: "
        "`rdc repo gpu grant alpha@m1 --device nvidia.com/gpu=all --exclusive --take-over`)"
    )
    gate.grants = frozenset({"rediacc.io/dri=renderD128"})
    gate.blocked = {"nvidia.com/gpu=all": held}
    refusal = only_refusal(
        gate.decide(create(DeviceRequests=[{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]))
    )
    assert refusal.replacement == (
        f"no NVIDIA GPU: nvidia.com/gpu=all cannot be granted to this repo now: {held}; "
        "what it holds: --device rediacc.io/dri=renderD128"
    )


def test_legacy_visible_devices_advice_follows_the_grants(gate: Gate) -> None:
    gate.grants = frozenset({"nvidia.com/gpu=1"})
    refusal = only_refusal(gate.decide(create(["NVIDIA_VISIBLE_DEVICES=0"])))
    assert refusal.replacement is not None
    assert refusal.replacement.startswith("docker run --device nvidia.com/gpu=1 ")
    assert "nvidia.com/gpu=0 is not granted" in refusal.replacement


def test_requests_other_than_container_create_are_left_alone(gate: Gate) -> None:
    request = ApiRequest("POST", "/volumes/create", {}, {"Name": "v"})
    assert request_rules(request, gate.context()) == []


# --- NVIDIA_VISIBLE_DEVICES ------------------------------------------------------------------------


def test_visible_devices_without_cdi_is_refused_naming_exact_names(gate: Gate) -> None:
    refusal = only_refusal(
        gate.decide(create(["NVIDIA_VISIBLE_DEVICES=0,GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"]))
    )
    assert refusal.rule == "nvidia-visible-devices" and refusal.status == 403
    assert "runc ignores" in refusal.message
    assert (
        refusal.replacement == "docker run --device nvidia.com/gpu=0 (Compose: devices: [nvidia.com/gpu=0])"
    )


def test_mig_names_warn_about_compose_short_syntax(gate: Gate) -> None:
    gate.grants = frozenset({"nvidia.com/gpu=0:1"})
    refusal = only_refusal(gate.decide(create(["NVIDIA_VISIBLE_DEVICES=0:1"])))
    assert refusal.replacement is not None
    assert "--device nvidia.com/gpu=0:1" in refusal.replacement and "long syntax" in refusal.replacement


@pytest.mark.parametrize("value", ["none", "void", ""])
def test_no_gpu_values_are_admitted(gate: Gate, value: str) -> None:
    assert gate.decide(create([f"NVIDIA_VISIBLE_DEVICES={value}"])) == []


def test_malformed_visible_devices_is_a_bad_request(gate: Gate) -> None:
    refusal = only_refusal(gate.decide(create(["NVIDIA_VISIBLE_DEVICES=first-gpu"])))
    assert refusal.status == 400 and "'first-gpu' is not a GPU index" in refusal.message


def test_translate_setting_rewrites_to_cdi(gate: Gate) -> None:
    gate.settings["legacy-visible-devices"] = "translate"
    (rewrite,) = gate.decide(
        create(["NVIDIA_VISIBLE_DEVICES=00000000:84:00.0", "NVIDIA_MIG_MONITOR_DEVICES=all"])
    )
    assert rewrite == Rewrite(
        description=(
            "NVIDIA_VISIBLE_DEVICES=00000000:84:00.0, NVIDIA_MIG_MONITOR_DEVICES=all "
            "translated to CDI devices nvidia.com/gpu=all"
        ),
        add_cdi_devices=("nvidia.com/gpu=all",),
        remove_env=("NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"),
    )


def test_translated_devices_are_checked_against_requirements(gate: Gate) -> None:
    gate.settings["legacy-visible-devices"] = "translate"
    verdicts = gate.decide(create(["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_ARCH=arch>=9.0"]))
    assert isinstance(verdicts[0], Rewrite) and verdicts[0].add_cdi_devices == ("nvidia.com/gpu=1",)
    assert isinstance(verdicts[1], Refusal) and "unsatisfied condition: arch>=9.0" in verdicts[1].message


def test_visible_devices_next_to_a_cdi_request_is_harmless(gate: Gate) -> None:
    assert gate.decide(create(["NVIDIA_VISIBLE_DEVICES=all"]), ("nvidia.com/gpu=0",)) == []


# --- NVIDIA_REQUIRE_* ---------------------------------------------------------------------------------


def test_unsatisfied_cuda_requirement_from_env_is_refused_with_advice(gate: Gate) -> None:
    refusal = only_refusal(
        gate.decide(create([f"NVIDIA_REQUIRE_CUDA={CUDA_12_IMAGE}"]), ("nvidia.com/gpu=0",))
    )
    assert refusal.status == 403 and refusal.rule == "nvidia-require"
    assert "GPU 0 (NVIDIA A100-SXM4-40GB): unsatisfied condition: cuda>=12.2" in refusal.message
    assert CUDA_ADVICE in refusal.message
    assert "CUDA driver version 11.6" in refusal.message and "NVIDIA_DISABLE_REQUIRE=true" in refusal.message


def test_requirement_from_the_images_own_env(gate: Gate) -> None:
    gate.images["cuda:12.2"] = {"Env": ["PATH=/usr/bin", f"NVIDIA_REQUIRE_CUDA={CUDA_12_IMAGE}"]}
    refusal = only_refusal(gate.decide(create(), ("nvidia.com/gpu=all",)))
    assert "unsatisfied condition: cuda>=12.2" in refusal.message
    gate.images["cuda:11.4"] = {"Env": ["NVIDIA_REQUIRE_CUDA=cuda>=11.4"]}
    assert gate.decide(create(image="cuda:11.4"), ("nvidia.com/gpu=all",)) == []


def test_a_whole_inspect_answer_is_read_too(gate: Gate) -> None:
    gate.images["cuda:12.2"] = {"Id": "sha256:1", "Config": {"Env": ["NVIDIA_REQUIRE_CUDA=cuda>=12.0"]}}
    assert len(gate.decide(create(), ("nvidia.com/gpu=0",))) == 1


def test_requests_env_overrides_the_images(gate: Gate) -> None:
    gate.images["cuda:12.2"] = {"Env": [f"NVIDIA_REQUIRE_CUDA={CUDA_12_IMAGE}"]}
    assert gate.decide(create(["NVIDIA_REQUIRE_CUDA=cuda>=11.0"]), ("nvidia.com/gpu=0",)) == []


def test_disable_require_turns_checks_off(gate: Gate) -> None:
    gate.images["cuda:12.2"] = {"Env": [f"NVIDIA_REQUIRE_CUDA={CUDA_12_IMAGE}"]}
    assert gate.decide(create(["NVIDIA_DISABLE_REQUIRE=true"]), ("nvidia.com/gpu=0",)) == []


def test_legacy_cuda_version_image(gate: Gate) -> None:
    gate.images["cuda:12.2"] = {"Env": ["CUDA_VERSION=12.2.140"]}
    refusal = only_refusal(gate.decide(create(), ("nvidia.com/gpu=0",)))
    assert "unsatisfied condition: cuda>=12.2" in refusal.message and CUDA_ADVICE in refusal.message


def test_every_requested_gpu_must_satisfy(gate: Gate) -> None:
    env = ["NVIDIA_REQUIRE_BRAND=brand=nvidia"]
    assert gate.decide(create(env), ("nvidia.com/gpu=0",)) == []
    refusal = only_refusal(gate.decide(create(env), ("nvidia.com/gpu=0", "nvidia.com/gpu=1")))
    assert "GPU 1 (NVIDIA GeForce RTX 4090): unsatisfied condition: brand=nvidia" in refusal.message
    assert CUDA_ADVICE not in refusal.message


def test_mig_device_is_judged_by_its_gpu(gate: Gate) -> None:
    assert len(gate.decide(create(["NVIDIA_REQUIRE_ARCH=arch>=9.0"]), (f"nvidia.com/gpu={M1}",))) == 1
    assert gate.decide(create(["NVIDIA_REQUIRE_ARCH=arch>=8.0"]), ("nvidia.com/gpu=0:1",)) == []


def test_malformed_requirement_is_a_bad_request(gate: Gate) -> None:
    refusal = only_refusal(gate.decide(create(["NVIDIA_REQUIRE_CUDA=cuda>>12"]), ("nvidia.com/gpu=0",)))
    assert refusal.status == 400 and refusal.message.startswith("malformed requirement: NVIDIA_REQUIRE_CUDA")


def test_uninspectable_image_is_decided_on_the_request_and_logged(gate: Gate) -> None:
    assert gate.decide(create(image="missing:1"), ("nvidia.com/gpu=0",)) == []
    assert gate.decide(
        create(["NVIDIA_REQUIRE_CUDA=cuda>=12.2"], image="broken:latest"), ("nvidia.com/gpu=0",)
    )
    assert any("'missing:1' could not be inspected" in line for line in gate.lines)
    assert any("upstream daemon hung up" in line for line in gate.lines)


def test_requirements_are_not_checked_without_an_nvidia_device(gate: Gate) -> None:
    gate.images["cuda:12.2"] = {"Env": [f"NVIDIA_REQUIRE_CUDA={CUDA_12_IMAGE}"]}
    assert gate.decide(create(), ("rediacc.io/dri=renderD128",)) == []


def test_no_inventory_means_nothing_to_check_against(tmp_path: Path) -> None:
    gate = Gate(None, tmp_path)
    assert gate.decide(create(["NVIDIA_REQUIRE_CUDA=cuda>=99.0"]), ("nvidia.com/gpu=0",)) == []
    assert any("not in the machine's inventory" in line for line in gate.lines)


# --- NVIDIA_DRIVER_CAPABILITIES -------------------------------------------------------------------


def test_driver_capabilities_are_admitted_with_a_note_for_missing_parts(gate: Gate) -> None:
    gate.images["cuda:12.2"] = {"Env": []}
    spec = gate.machine.path("/etc/cdi/nvidia.yaml")
    spec.parent.mkdir(parents=True)
    spec.write_text(
        "containerEdits:\n  mounts:\n  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.510.47.03\n"
    )
    assert gate.decide(create(["NVIDIA_DRIVER_CAPABILITIES=compute,utility"]), ("nvidia.com/gpu=0",)) == []
    assert gate.lines == []
    assert gate.decide(create(["NVIDIA_DRIVER_CAPABILITIES=graphics,video"]), ("nvidia.com/gpu=0",)) == []
    assert gate.lines == [
        "nvidia: NVIDIA_DRIVER_CAPABILITIES=graphics,video has no effect under CDI; the machine's spec "
        "carries no driver files for graphics, video, so the container will not have them"
    ]
    spec.write_text(spec.read_text() + "  - hostPath: /usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0\n")
    gate.lines.clear()
    gate.decide(create(["NVIDIA_DRIVER_CAPABILITIES=all"]), ("nvidia.com/gpu=0",))
    assert len(gate.lines) == 1 and "graphics" not in gate.lines[0] and "video" in gate.lines[0]
