"""One request to a backend in the era it goes in.

A backend that spoke 2026-07-28 at discovery gets one stamped request of the router's own
(`_once`; router/upstream/wire/modern.py); a handshake-era backend gets the request inside the client
session's backend session, one opened first when there is none or the backend forgot it
(`_in_session`; router/upstream/wire/backend_messages.py), and kept before the request is sent in it
(router/upstream/calls/session_keeping.py). Each request runs under the backend's deadline, its
transport's failures turned into router errors (`translated`).

A few requests go to a 2026-07-28 backend in a handshake session instead (`Eras.session_first`):
those of a handshake-era client that can answer a backend's requests, which come only on a
session's call stream, and the subscriptions 2026-07-28 dropped. A backend that speaks both eras,
as the SDKs' servers do, is asked in the client's era then, as the client would ask it directly;
one that refuses the handshake is remembered, and gets 2026-07-28 requests as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import anyio
import httpx2
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from router.caller import Declared
from router.errors import (
    BackendError,
    BackendRejected,
    BackendSessionGone,
    BackendTimeout,
    BackendTooLarge,
    BackendUnavailable,
)
from router.upstream.calls.session_keeping import SessionKeeper
from router.upstream.wire.backend_messages import BackendMessenger
from router.upstream.wire.modern import modern_request
from toolsearch.sessions import BackendSession
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

# requests that live in a handshake session: a 2026-07-28 backend takes them in one only
_IN_SESSION_ONLY = frozenset({"resources/subscribe", "resources/unsubscribe"})
MAX_ROUNDS = 16  # input-required results of one request answered for a handshake-era client


class Eras:
    """Sends requests to backends in the era each should go in."""

    def __init__(self) -> None:
        # backends that spoke 2026-07-28 at discovery and refused a handshake session since
        self._sessionless: set[str] = set()

    async def send(
        self,
        messenger: BackendMessenger,
        target: BackendTarget,
        method: str,
        params: Mapping[str, Any],
        keeper: SessionKeeper,
    ) -> tuple[dict[str, Any], BackendSession | None, str]:
        """One request; its result, the backend session it ran in (None: none), and why a gone
        session was replaced ("" if none was). A session it opens goes to `keeper` before the
        request is sent in it. Raises the router's backend errors."""
        if _modern(target) and self.session_first(target, messenger.exchange.declared, method):
            target = await self._open_handshake(messenger, target, keeper)
        if _modern(target) and not _handshake_kept(target):
            return await _once(messenger, target, method, params), None, ""
        return await _in_session(messenger, target, method, params, keeper)

    def refuses_sessions(self, target: BackendTarget) -> bool:
        """Whether `target` spoke 2026-07-28 at discovery and has refused a handshake session since."""
        return _modern(target) and target.backend_id in self._sessionless

    def session_first(self, target: BackendTarget, declared: Declared, method: str) -> bool:
        """Whether a request to a 2026-07-28 backend is to open a handshake session there first.

        A handshake-era client that can answer a backend's requests (sampling, elicitation, roots)
        gets them on its call's stream only from a backend that asks them in a handshake session: a
        2026-07-28 request has no stream for them. A subscription (`resources/subscribe`, gone from
        2026-07-28) lives in a session too, and its updates come on that session's stream. A
        backend that speaks both eras, as the SDKs' servers do, is asked in the client's era then,
        as the client would ask it directly (and every later request of the client session goes
        in that session); one that refuses the handshake is remembered and gets 2026-07-28
        requests, as before.
        """
        needs_session = bool(declared.answers_on_stream) or (
            method in _IN_SESSION_ONLY and declared.handshake_era
        )
        return needs_session and target.session is None and target.backend_id not in self._sessionless

    async def _open_handshake(
        self, messenger: BackendMessenger, target: BackendTarget, keeper: SessionKeeper
    ) -> BackendTarget:
        """`target` with a handshake session opened (and kept) there; unchanged if it refuses one."""
        try:
            with translated(messenger, target.timeout_seconds):
                opened = await messenger.initialize()
        except (BackendUnavailable, BackendTimeout, BackendRejected, BackendTooLarge):
            raise  # not a refusal of the era: the call could not go either way
        except BackendError as exc:  # it answered initialize with an error, or with no result
            logger.info(
                "backend %s refused a handshake session: %s (2026-07-28 requests only)",
                target.backend_id,
                exc,
            )
            self._sessionless.add(target.backend_id)
            return target
        return replace(target, session=await keeper.keep(opened))


def _modern(target: BackendTarget) -> bool:
    """Whether `target` spoke 2026-07-28 at discovery: one request per call, no session."""
    return target.protocol_version in MODERN_PROTOCOL_VERSIONS


def _handshake_kept(target: BackendTarget) -> bool:
    """Whether the client session keeps a handshake-era session at `target` (`session_first`)."""
    return target.session is not None and target.session.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS


async def _once(
    messenger: BackendMessenger, target: BackendTarget, method: str, params: Mapping[str, Any]
) -> dict[str, Any]:
    """One 2026-07-28 request, stamped as that protocol has it (router/upstream/wire/modern.py).

    With the exchange's asker and a handshake-era client that answers on the call's stream, the
    backend is offered what that client can answer, and each input-required result it gives is
    asked of the client there (`collect`) and the request sent again with the answers and the
    backend's request state, up to `MAX_ROUNDS` times, all within the backend's timeout.
    """
    exchange = messenger.exchange
    asker = exchange.asker
    with translated(messenger, target.timeout_seconds):
        stamped, headers = modern_request(method, params, target.protocol_version, exchange)
        result = await messenger.request(method, stamped, None, headers)
        for _ in range(MAX_ROUNDS):
            requests = result.get("inputRequests")
            if (
                asker is None
                or result.get("resultType") != "input_required"
                or not isinstance(requests, dict)
            ):
                break
            answers = await asker.collect(messenger.backend_id, requests, target.timeout_seconds)
            if answers is None:
                break  # not asked: the result goes to the client as it came
            again = {**params, "inputResponses": answers}
            if "requestState" in result:
                again["requestState"] = result["requestState"]
            stamped, headers = modern_request(method, again, target.protocol_version, exchange)
            result = await messenger.request(method, stamped, None, headers)
        return result


async def _in_session(
    messenger: BackendMessenger,
    target: BackendTarget,
    method: str,
    params: Mapping[str, Any],
    keeper: SessionKeeper,
) -> tuple[dict[str, Any], BackendSession, str]:
    """One request inside the target's session, or inside a new backend session when there is none
    or the backend forgot it (once); returns the result, the session it ran in, and why a gone
    session was replaced ("" if none was). A new session goes to `keeper` before the request."""
    replaced = ""
    session = target.session
    with translated(messenger, target.timeout_seconds):
        if session is not None:
            try:
                return await messenger.request(method, params, session), session, ""
            except BackendSessionGone as gone:
                logger.info("backend %s forgot its session: opening a new one", messenger.backend_id)
                replaced = gone.reason
        session = await keeper.keep(await messenger.initialize())
        return await messenger.request(method, params, session), session, replaced


@contextmanager
def translated(messenger: BackendMessenger, timeout_seconds: float) -> Iterator[None]:
    """The request's deadline, and its transport's failures as router errors."""
    backend_id = messenger.backend_id
    try:
        with anyio.fail_after(timeout_seconds):
            yield
    except TimeoutError:
        raise BackendTimeout(backend_id, timeout_seconds) from None
    except httpx2.TimeoutException:
        raise BackendTimeout(backend_id, timeout_seconds) from None
    except httpx2.TransportError:
        if messenger.bounded.exceeded:
            raise BackendTooLarge(backend_id, messenger.bounded.limit) from None
        raise BackendUnavailable(backend_id, "dropped the connection") from None
