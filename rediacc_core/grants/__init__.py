"""GPU grants: which exact CDI device names each repo identity may use on a machine.

A grant names one device exactly: granting `vendor.example/gpu=all` admits that name and never
`vendor.example/gpu=0`. Names are checked against the CDI specs on the machine (the directory the
repo daemons read) and the plugins' own grant rules when written, so a typo is refused rather than
recorded. An exclusive grant reserves the hardware a name reaches for one repo.

Every check and write happens under the machine's state lock (`rediacc_core.statelock`), so two
grants can never both pass a check the other would fail.

A grant records what its name reached when granted (`bound_to`, see `bindings.py`); setup's re-check
(`recheck.py`) suspends one whose name vanished, moved to other hardware or overlaps another repo's
exclusive reservation. A suspended grant stays in the file (it still reserves, and it is listed) but
reaches nothing: the gate and the runtime guard refuse it until `rdc repo gpu confirm` or a revoke.

The modules, each imported from where it holds its names (this package's face exports none, so a
reader of grants loads only `records`):

- `records`: the `Grant`, the grants file read and written (with its drain marks and residue), leases
  and suspensions as read at a moment;
- `live`: `LiveGrants`, the grants as the gate reads them, re-read only when the file changed;
- `units`: the hardware units a name reaches, and when two overlap;
- `checks`: what a grant is checked against (names, grantability, other repos' grants in the way);
- `release`: emptying a repo, the one place hardware leaves it (revoke, drain, stop, then grant);
- `handover`: an exclusive grant against the running parts of other repos (`RunningParts`);
- `store`: `GrantStore`, grant, renew and revoke under the state lock.
"""
