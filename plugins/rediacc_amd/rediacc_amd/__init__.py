"""rediacc_amd plugin for rediacc-core: hook implementations only."""
