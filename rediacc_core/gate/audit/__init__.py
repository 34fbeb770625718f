"""The gate's audit trail, in rooms by job: `log` (the writer: one JSON line per decision),
`read` (reading it back, `rdc repo gate log`), `metrics` (the Prometheus counters and their
textfile), `peer` and `sshpeer` (who is behind a connection)."""
