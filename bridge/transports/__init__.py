"""How the bridge reaches a server: a child process's pipes (its stderr in our log) or a legacy SSE
event stream, each held as a `Link`."""
