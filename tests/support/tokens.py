"""HS256 tokens for tests: the router, the catalog server and passthrough backends verify real JWTs."""

from __future__ import annotations

import time
from typing import Any

import jwt


def hs256(secret: str, subject: str = "alice", expires_in: float = 300, **claims: Any) -> str:
    """A token for `subject`, issued now and expiring `expires_in` seconds from now."""
    now = time.time()
    payload = {"sub": subject, "iat": int(now), "exp": int(now + expires_in), **claims}
    return jwt.encode(payload, secret, algorithm="HS256")
