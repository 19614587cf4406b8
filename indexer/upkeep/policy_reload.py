"""Policy reload: the authorization files read again every few seconds, a good change put in force.

Every replica reads its own copy of the files (`authorization.policies` and `entities_file`) every
`reload_interval` seconds and compares their bytes with the last read. Polling, not watching: a
Kubernetes ConfigMap update swaps a symlink to a new folder, which a watch on the old file misses and
a fresh read sees. A change is checked in full (indexer/authorization/policies.py): a file that
passes goes in force at once (`Authorizer.replace`) and, when it decides differently (another
fingerprint: comments and spacing make none), `changed(reason)` is called, so that sessions get new
versions as they do after a health change (`Rebuilder.request`). A file that fails keeps the last
good policy in force and is logged once, in one line; a file that cannot be read likewise. The gate
never opens on a bad file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from indexer.authorization.authorizer import Authorizer
from indexer.authorization.policies import Policy, load_policy
from indexer.authorization.source import PolicyError
from toolsearch.sections.authorization_settings import Authorization

logger = logging.getLogger(__name__)

Changed = Callable[[str], None]


def files_digest(settings: Authorization) -> str:
    """A hash of the files' bytes as they are now (a file that cannot be read: why, instead)."""
    digest = hashlib.sha256()
    for path in (settings.policies, settings.entities_file):
        if path is None:
            continue
        try:
            digest.update(hashlib.sha256(Path(path).read_bytes()).digest())
        except OSError as exc:
            digest.update(f"unreadable: {exc.errno}".encode())
    return digest.hexdigest()


class PolicyWatcher:
    """Reads the authorization files again on an interval and puts a good change in force."""

    def __init__(
        self,
        settings: Authorization,
        authorizer: Authorizer,
        changed: Changed,
        interval: float | None = None,
    ) -> None:
        self._settings = settings
        self._authorizer = authorizer
        self._changed = changed
        self._interval = settings.reload_interval if interval is None else interval
        self._seen: str | None = None  # the bytes last read; None: none yet, so the first read checks
        self._task: asyncio.Task[None] | None = None
        self.reloads = 0  # changes put in force, for tests and logs

    def start(self) -> None:
        """Poll until `close`; must be called on the event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="policy-reload")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.check()
            except Exception:
                # reading and checking are bounded and local: a surprise here must not end the polls
                logger.exception("authorization: checking %s failed", self._settings.policies)

    async def check(self) -> bool:
        """Read the files once; whether a change went in force that decides differently."""
        digest = await asyncio.to_thread(files_digest, self._settings)
        if digest == self._seen:
            return False
        self._seen = digest
        try:
            policy: Policy = await asyncio.to_thread(load_policy, self._settings)
        except PolicyError as exc:
            kept = self._authorizer.policy.fingerprint[:12]
            logger.warning("authorization: %s (the policy in force, %s, stays)", exc, kept)
            return False
        if not self._authorizer.replace(policy):
            return False
        self.reloads += 1
        reason = f"authorization policy {policy.fingerprint[:12]}"
        logger.info("%s in force: %d policies from %s", reason, len(policy.rules), policy.path)
        self._changed(reason)
        return True

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
