"""Settings every test process shares, made before any test module loads torch."""

import os

# As the `toolsearch` command does for its processes: the in-process model then runs on every core
# without its OpenMP workers spinning against the stack's processes on the same cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
