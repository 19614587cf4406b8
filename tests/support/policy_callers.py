"""Callers under an authorization policy: the router's JWT settings, the tokens it verifies, the file.

A stack's router takes `{"auth": ROUTER_AUTH}` and the environment `{SECRET_ENV: SECRET}`; its
configuration's `authorization` section is `policy_file(folder, POLICY, interval)`, which writes the
policy beside it; a caller's token is `mint(subject, **claims)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.policies import POLICY_FILE
from tests.support.tokens import hs256

SECRET = "authorization-test-secret-long-enough-for-hs256"
SECRET_ENV = "TS_JWT"
ISSUER = "https://issuer.test"
ROUTER_AUTH = {"mode": "jwt", "issuer": ISSUER, "audience": "toolsearch", "hs256_secret_env": SECRET_ENV}


def mint(subject: str, **claims: Any) -> str:
    """A token the router verifies, for `subject` with `claims`, valid for ten minutes."""
    return hs256(SECRET, subject, 600, iss=ISSUER, aud="toolsearch", **claims)


def policy_file(folder: Path, policy: str, reload_interval: float) -> dict[str, Any]:
    """The authorization section naming `policy`, written into `folder` (the configuration's)."""
    (folder / POLICY_FILE).write_text(policy, encoding="utf-8")
    return {"policies": str(POLICY_FILE), "reload_interval": reload_interval}
