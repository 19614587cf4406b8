"""The health-to-swap path.

Probes and their verdicts, rebuild passes, the replica lease, configuration reloads.
"""
