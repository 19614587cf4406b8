"""Servers kept running: a shared backend's one process supervised, a per_session backend's pool,
the first starts readiness waits for, and the bridge sessions that hear each server."""
