"""Talking to backends, in four wings, each importing only those below it.

`session_wide/` what concerns all of a client session's backends (requests other than calls, their
streams outside calls, listens, notices, one question to several); `rounds/` a backend's questions
carried across the protocol eras; `calls/` a call to one backend and what it carries (credentials,
the backend session it runs in, its cancellation); `wire/` one request's exchange with a backend in
either era (connections, answers, relays of what it streams).
"""
