"""One request's exchange with a backend, in either protocol era: the connection pools, the JSON-RPC
messages of a kept backend session or a 2026-07-28 request, the answer read back, and the relays of
what a backend streams during a call."""
