"""Talking to backends.

Kept backend sessions, one-off SDK connections, relays, and asking several at once.
"""
