"""The wire, read as the daemon reads it: Go-exact JSON decoding of request bodies (`decode`, its
field tables in `decode_fields`), protobuf's wire format (`protowire`), and the CDI names a
HostConfig asks for (`devicerequests`). No policy here: only what the bytes say."""
