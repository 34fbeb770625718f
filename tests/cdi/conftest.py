"""Spec documents shaped like the ones `nvidia-ctk cdi generate` writes (written for these tests)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

GPU0_UUID = "GPU-4b0e3c7a-9d21-5f6e-8a13-2c7d90e1f5ab"
MIG_UUID = "MIG-7c1d2e3f-4a5b-5c6d-9e8f-0a1b2c3d4e5f"

# What a generator writes for a single-GPU machine with one MIG instance, in YAML as emitted.
CTK_YAML = f"""\
---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/dri/card1
    - path: /dev/dri/renderD128
    hooks:
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args:
      - nvidia-cdi-hook
      - create-symlinks
      - --link
      - ../card1::/dev/dri/by-path/pci-0000:3b:00.0-card
- name: {GPU0_UUID}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/dri/card1
    - path: /dev/dri/renderD128
- name: "0:1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia-caps/nvidia-cap12
    - path: /dev/nvidia-caps/nvidia-cap13
- name: {MIG_UUID}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia-caps/nvidia-cap12
    - path: /dev/nvidia-caps/nvidia-cap13
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/dri/card1
    - path: /dev/dri/renderD128
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  - path: /dev/nvidia-uvm-tools
  - path: /dev/nvidia-modeset
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
    env:
    - NVIDIA_CTK_DEBUG=false
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options:
    - ro
    - nosuid
    - nodev
    - bind
  - hostPath: /run/nvidia-persistenced/socket
    containerPath: /run/nvidia-persistenced/socket
    options:
    - ro
    - nosuid
    - nodev
    - bind
    - noexec
"""


def gpu_spec(*names: str, version: str = "0.5.0", kind: str = "nvidia.com/gpu") -> dict[str, Any]:
    """A small valid spec: one device node per named device plus the shared control node."""
    return {
        "cdiVersion": version,
        "kind": kind,
        "devices": [
            {"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}}
            for i, name in enumerate(names or ("0",))
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
        },
    }


SpecFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def make_spec() -> SpecFactory:
    """`make_spec("0", "1", version=..., kind=...)` builds a small valid spec document."""
    return gpu_spec


@pytest.fixture
def ctk_yaml() -> str:
    return CTK_YAML


@pytest.fixture
def ctk_doc() -> dict[str, Any]:
    """CTK_YAML as a document, a fresh copy per test so tests can break it freely."""
    return copy.deepcopy(yaml.safe_load(CTK_YAML))
