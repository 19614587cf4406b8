"""Talking to backends.

Kept backend sessions, 2026-07-28 requests, relays, and asking several at once.
"""
