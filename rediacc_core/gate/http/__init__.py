"""HTTP/1.1 for the gate, without sockets: parsing and checking heads and chunked bodies
(`messages`), and where each message starts and ends on a connection (`framing`)."""
