"""The gRPC process.

Its server and parts, the servicer, its messages, and the flows it answers (find, resolve, reach).
"""
