"""A repo's running parts: its own dockerd (`daemon`), the gate process in front of it (`serve`),
bringing both up and down (`lifecycle`), and making sure nothing of the repo outlives `down`
(`teardown`). What the gate decides lives in `rediacc_core.gate`."""
