"""The MCP requests the router answers.

The meta-tools, resources, prompts and their arguments.
"""
