"""The front door.

The app and its server, the session layer, who calls, and the bounds on what a caller sends.
"""
