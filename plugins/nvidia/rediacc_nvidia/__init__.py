"""rediacc_nvidia plugin for rediacc-core: hook implementations only."""
