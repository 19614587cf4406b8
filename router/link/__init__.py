"""The link to the indexer.

The typed gRPC calls, and which failed calls are tried again where.
"""
