"""Backends.

The registry of what each serves and how it is, discovery, credentials, kept backend sessions,
adopted health.
"""
