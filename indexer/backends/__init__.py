"""Backends.

The registry of what each serves and how it is, the lister that asks them (listings, probes,
discovery), credentials, kept backend sessions, adopted health.
"""
