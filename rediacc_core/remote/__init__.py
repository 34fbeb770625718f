"""Machines reached over SSH: the address, the OpenSSH transport, the agent and its protocol.

The client never touches a remote machine's files itself: it forwards the whole `rdc` invocation to
`rdc-agent` on the machine (`dispatch`), which runs the same command there against the machine's own
root, locks and atomic writes, and streams the answer back (`protocol`).
"""
