"""Test kit for rediacc-core and its plugins: simulated machines with the real kernel layout.

Vendor plugins add their own layouts on top (each ships a `testing` module of its own), so this
kit stays vendor-neutral like the rest of the core.
"""

from rediacc_core.testing.fakemachine import FakeMachine, device_numbers
from rediacc_core.testing.realdata import capture as real_capture

__all__ = ["FakeMachine", "device_numbers", "real_capture"]
