"""The decider's room: a request against the machine's records, decided in one pipeline.

`decider` is the facade (a request's route, found once, decides which checks run); `decision`
what a decision is (forward, refuse or answer, each with its audit fields; floor 2, so the
exchange may read it); `live_facts` and `allowances` what it decides on; `start_checks`,
`grant_refusals` and `health_check` the checks of a request that makes a container run or names
devices; `body` a canonical body's core and plugin rules; `answers` the answers the gate makes
itself (through its route's view, `policy.views`); `containers` and `images` what it asks the
repo's daemon. Nothing is imported here, so the exchange reading `decision` loads none of the rest.
"""
