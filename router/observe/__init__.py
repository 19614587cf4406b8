"""What the router shows of itself.

Prometheus metrics, the access log, the status page.
"""
