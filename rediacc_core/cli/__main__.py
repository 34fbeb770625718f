"""`python -m rediacc_core.cli`: the same as the `rdc` console script."""

from rediacc_core.cli import main

main()
