"""Sessions.

Their records and limits, each session's catalog now, the live view a request reads, and the
versions they are moved to when their backends change.
"""
