"""A call to one backend and what it carries: the caller's credentials, the backend session it
runs in (kept, replaced, noted in its result), and the running calls a cancellation can reach."""
