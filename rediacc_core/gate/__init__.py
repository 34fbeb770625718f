"""The gate: the request path in front of each repo's dockerd, in rooms by floor.

Record-free parts (floor 2): `wire` (decoding as the daemon decodes), `policy` (endpoints, fields,
rules), `decision` (what a decision is: forward, refuse or answer), `http` (framing, sans-IO),
`audit` (the trail and the metrics). The engine (floor 4):
`buildkit` (the gRPC calls a build makes, and their relay), `images` and `containers` (what the
gate asks the repo's daemon), `views` (what a read shows a tenant), `decide` (a request against the
machine's records) and `server` (the asyncio glue). `tests/test_layers.py` holds the floors.
"""
