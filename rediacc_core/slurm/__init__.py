"""Fleet scheduling with Slurm: Slurm decides who gets which GPU, where and when; rdc decides what
that allocation means on the machine, as a grant tagged with the job, and lets nothing else through.

Rooms: `gres` (the node's gres.conf and its index map, from the inventory), `access` (which Slurm
users and accounts may lease for a repo), `client` (the Slurm CLIs, read through `--json`), `hooks`
(the prolog and the epilog), `reconcile` (grants whose job Slurm no longer runs, or whose end
moved), `drains` (cards held back drain the node), `requests` (a lease asked for and ended from
rdc), `follow` (what setup, refresh, a health clear, a confirm and a revoke do for Slurm), `round`
(the reconciler and the health sync in each repo gate's housekeeping round).
"""
