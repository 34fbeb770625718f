"""rediacc_dri plugin for rediacc-core: hook implementations only."""
