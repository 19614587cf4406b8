"""What concerns all of a client session's backends: requests other than tools/call, the streams
they send outside calls, listens, the client's notices to each, and one question put to several."""
