"""Sessions.

Their records and limits, each session's catalog now, and the live view a request reads.
"""
