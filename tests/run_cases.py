"""`docker run` options the gate refuses, with a word the refusal must contain: one list for the e2e
suite (the live gate, through the real docker CLI) and for `rdc repo check` (the same decision offline)."""

from __future__ import annotations

GPU0 = "vendor.example/gpu=0"

REFUSED_RUNS: list[tuple[list[str], str]] = [
    (["--gpus", "all"], "--device"),
    (["--gpus", "device=0"], "--device"),
    (["--privileged"], "rivileged"),
    (["--device", "/dev/fakegpu0"], "/dev/fakegpu0"),
    (["--device", "/dev/null:/dev/fakegpu0"], "/dev/null"),
    (["-v", "/dev:/dev"], "/dev"),
    (["-v", "/dev/null:/x"], "/dev/null"),
    (["--mount", "type=bind,src=/dev/null,dst=/x"], "/dev/null"),
    (
        ["--mount", "type=volume,dst=/x,volume-opt=type=none,volume-opt=o=bind,volume-opt=device=/dev"],
        "/dev",
    ),
    (["--device-cgroup-rule", "c 1:3 rwm"], "cgroup"),
    (["--runtime", "nvidia"], "runtime"),
    (["--runtime", "io.containerd.runc.v2"], "runtime"),
    (["--annotation", f"cdi.k8s.io/x={GPU0}"], "cdi.k8s.io"),
]


def case_id(value: object) -> str | None:
    return " ".join(value) if isinstance(value, list) else None
