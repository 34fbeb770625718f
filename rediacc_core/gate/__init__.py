"""The gate: the request path in front of each repo's dockerd, in rooms by floor.

Record-free parts (floor 2): `wire` (decoding as the daemon decodes), `policy` (endpoints, fields,
rules), `decide.decision` (what a decision is: forward, refuse or answer), `http` (framing,
sans-IO), `audit` (the trail and the metrics). The engine (floor 4): `buildkit` (the gRPC calls a
build makes, and their relay), `decide` (the decider's room: a request against the machine's
records, and what it asks the repo's daemon) and `server` (the asyncio glue, outside the room).
`tests/test_layers.py` holds the floors.
"""
