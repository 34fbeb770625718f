"""The Container Device Interface as the core needs it: names, spec files and the device registry.

Vendor-neutral: plugins produce specs, this package checks and reads them the way the container
engine's CDI loader does, so what the gate allows is exactly what the daemon can inject.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rediacc_core.cdi.names import (
        CdiNameError,
        QualifiedName,
        is_qualified_name,
        parse_qualified_name,
        validate_class,
        validate_device_name,
        validate_vendor,
    )
    from rediacc_core.cdi.registry import (
        DeviceEntry,
        Fingerprint,
        Registry,
        RegistryCache,
        fingerprint,
        suggest,
    )
    from rediacc_core.cdi.spec import (
        KNOWN_VERSIONS,
        CdiSpecError,
        Spec,
        device_nodes,
        dump_spec,
        load_spec,
        validate_spec,
        write_spec,
    )

# Each name is imported from its module on first use (PEP 562): `rediacc_core.cdi.names` alone
# must not pull in the spec schema and jsonschema (every CLI command parses names; few load specs).
_HOMES = {
    "names": (
        "CdiNameError",
        "QualifiedName",
        "is_qualified_name",
        "parse_qualified_name",
        "validate_class",
        "validate_device_name",
        "validate_vendor",
    ),
    "registry": ("DeviceEntry", "Fingerprint", "Registry", "RegistryCache", "fingerprint", "suggest"),
    "spec": (
        "KNOWN_VERSIONS",
        "CdiSpecError",
        "Spec",
        "device_nodes",
        "dump_spec",
        "load_spec",
        "validate_spec",
        "write_spec",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "KNOWN_VERSIONS",
    "CdiNameError",
    "CdiSpecError",
    "DeviceEntry",
    "Fingerprint",
    "QualifiedName",
    "Registry",
    "RegistryCache",
    "Spec",
    "device_nodes",
    "dump_spec",
    "fingerprint",
    "is_qualified_name",
    "load_spec",
    "parse_qualified_name",
    "suggest",
    "validate_class",
    "validate_device_name",
    "validate_spec",
    "validate_vendor",
    "write_spec",
]
