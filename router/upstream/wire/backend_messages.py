"""JSON-RPC messages to a handshake-era Streamable HTTP backend, inside a backend session the router keeps.

The SDK's client opens a session when it starts and ends it when it stops, which is one initialize,
one call and one DELETE per `call_tool`. The router keeps a backend session for as long as the
client session lives instead (its id is stored with the client session in the indexer, so every
replica reuses it), so it posts the messages of the transport itself: `initialize` and
`notifications/initialized` once, then each call as one POST carrying `Mcp-Session-Id` and the
negotiated `MCP-Protocol-Version`. An answer is JSON or an SSE stream; in a stream, the answer is
the message with the request's id, and what comes before it is the backend's notifications.

Failures are router errors (router/errors.py): `BackendSessionGone` for a 404 inside a session (the
backend restarted and forgot it; also a 400 whose error names the session), `BackendRejected` for
401/403, `BackendUnavailable` for any other HTTP error or a dropped connection, `BackendError` for a
JSON-RPC error or an answer that is not one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import anyio
import httpx2
from mcp_types import INTERNAL_ERROR, METHOD_NOT_FOUND
from mcp_types.version import LATEST_HANDSHAKE_VERSION

from router.caller import ANSWERABLE
from router.errors import (
    BackendError,
    BackendRejected,
    BackendSessionGone,
    BackendTooLarge,
    BackendUnavailable,
    CapabilityMissing,
)
from router.exchange import Exchange
from router.upstream.wire.backend_answers import (
    StreamPosition,
    answered,
    error_body,
    finished,
    forgot,
    is_stream,
    messages_of,
    streamed,
)
from toolsearch.outgoing import ROUTER_CLIENT_NAME, SESSION_HEADER, VERSION_HEADER, client_info
from toolsearch.responses import STREAMED, BoundedTransport
from toolsearch.sessions import BackendSession
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

ABANDON_TIMEOUT = 2.0  # seconds to tell a backend its requests of the client go unanswered, at most
MAX_RESUMES = 20  # times one call's stream is resumed after its backend closed it early
MAX_RESUME_DELAY_MS = 5000  # the longest `retry:` delay honoured before a resumption
_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


class BackendMessenger:
    """Posts the messages of one request to one backend through `http` (headers, deadline, size
    bound), for the client request `exchange`: what the client declared, where what the backend
    streams goes (its relay), how the client is asked across the eras (its asker)."""

    def __init__(
        self, target: BackendTarget, http: httpx2.AsyncClient, bounded: BoundedTransport, exchange: Exchange
    ) -> None:
        self.backend_id = target.backend_id
        self.url = target.url
        self.http = http
        self.bounded = bounded
        self.exchange = exchange
        self.timeout = target.timeout_seconds  # as long as a backend's request of the client waits
        self._next_id = 0

    def _headers(self, session: BackendSession | None) -> dict[str, str]:
        headers = dict(_ACCEPT)
        if session is not None:
            if session.session_id:
                headers[SESSION_HEADER] = session.session_id
            if session.protocol_version:
                headers[VERSION_HEADER] = session.protocol_version
        return headers

    async def _post(self, message: Mapping[str, Any], session: BackendSession | None) -> httpx2.Response:
        try:
            response = await self.http.post(self.url, json=dict(message), headers=self._headers(session))
        except httpx2.ConnectError:
            raise BackendUnavailable(self.backend_id, "refused the connection") from None
        return self._checked(response, session)

    def _checked(self, response: httpx2.Response, session: BackendSession | None) -> httpx2.Response:
        """The answer, if its status is a success; else the router error it means."""
        if self.bounded.exceeded:  # the bounded transport's stand-in answer
            raise BackendTooLarge(self.backend_id, self.bounded.limit)
        status = response.status_code
        if session is not None and session.session_id and forgot(response):
            raise BackendSessionGone(self.backend_id, f"forgot its session (HTTP {status})")
        if status in (401, 403):
            raise BackendRejected(self.backend_id, status)
        if 400 <= status < 500 and (error := error_body(response)) is not None:
            # a JSON-RPC error with a client-error status (2026-07-28 maps errors to 400 and 404):
            # the backend's own answer; a server error says the backend cannot serve now, whatever
            # its body, and stays an unavailable backend (the agent may try again later)
            raise answered(self.backend_id, error)
        if 300 <= status < 400:
            # redirects are not followed (a call's POST would be replayed elsewhere): say where to
            where = response.headers.get("location", "")
            raise BackendUnavailable(self.backend_id, f"answered HTTP {status}, a redirect to {where!r}")
        if status >= 400:
            raise BackendUnavailable(self.backend_id, f"answered HTTP {status}")
        return response

    async def request(
        self,
        method: str,
        params: Mapping[str, Any],
        session: BackendSession | None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one request and return its result; raises the router errors above.

        The answer is read as it arrives: the notifications before the result go to the exchange's
        relay, and so does a request the backend makes of its client meanwhile (sampling,
        elicitation, roots) when the client can answer it (`Exchange.pass_on`; the client's answer
        reaches the backend by another way: router/upstream/session_wide/backend_notices.py).
        Any other such request is refused at once (`_refuse`), so the backend goes on instead of
        waiting for an answer that would never come. If the client did not even declare the
        capability such a request needs, the request's answer is `CapabilityMissing` (MCP's
        `-32021`), whatever the backend made of the refusal. A request that ends without its result
        (its deadline, a failure) tells the backend that what it asked the client goes unanswered.
        A call goes under the id its client's cancellation names (`Exchange.call_id`), any other
        request under a counter's; `extra_headers` go with the POST (a 2026-07-28 request's,
        router/upstream/wire/modern.py).
        """
        request_id: str | int | None = self.exchange.call_id if method == "tools/call" else None
        if request_id is None:
            self._next_id += 1
            request_id = self._next_id
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}
        headers = {**self._headers(session), **(extra_headers or {})}
        asked: list[str | int] = []  # the backend's requests passed on to the client
        try:
            return await self._exchange(message, headers, session, asked)
        except BaseException:
            if asked:
                await self._abandon(asked, session)
            raise

    async def _exchange(
        self,
        message: Mapping[str, Any],
        headers: Mapping[str, str],
        session: BackendSession | None,
        asked: list[str | int],
    ) -> dict[str, Any]:
        """`request`'s POST and the reading of its answer; the requests passed on go to `asked`.

        A backend may close a call's stream before the result and have it resumed (SSE polling,
        SEP-1699): its events carry ids, and a `GET` inside the session with the last one as
        `Last-Event-ID` goes on where it stopped. The router does that itself, after the delay the
        backend asked for (`retry:`, at most `MAX_RESUME_DELAY_MS`), up to `MAX_RESUMES` times, all
        within the call's deadline; the client sees one stream.
        """
        position = StreamPosition()
        lacked: dict[str, Any] = {}  # capabilities the backend asked for and the client lacks
        try:
            async with self.http.stream(
                "POST", self.url, json=message, headers=headers, extensions={STREAMED: True}
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                self._checked(response, session)
                answer = await self._read(response, message["id"], session, asked, lacked, position)
            for _ in range(MAX_RESUMES):
                if answer is not None or not position.last_id or session is None or not session.session_id:
                    break
                await anyio.sleep(min(position.retry_ms or 0, MAX_RESUME_DELAY_MS) / 1000)
                resume = {
                    **self._headers(session),
                    "Accept": "text/event-stream",
                    "Last-Event-ID": position.last_id,
                }
                resume.pop("Content-Type", None)
                async with self.http.stream(
                    "GET", self.url, headers=resume, extensions={STREAMED: True}
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                    try:
                        self._checked(response, session)
                    except BackendSessionGone as gone:
                        # not a session to open again and send the call in: the call has run, or
                        # runs still, in the session the backend forgot
                        raise BackendUnavailable(
                            self.backend_id, f"{gone.reason} while the call's stream was resumed"
                        ) from None
                    if not is_stream(response):
                        raise BackendUnavailable(
                            self.backend_id,
                            f"answered the resumption of a call's stream with HTTP {response.status_code}",
                        )
                    answer = await self._read(response, message["id"], session, asked, lacked, position)
        except httpx2.ConnectError:
            raise BackendUnavailable(self.backend_id, "refused the connection") from None
        except ValueError:
            raise BackendError(self.backend_id, "answered with something that is not JSON-RPC") from None
        if answer is None:
            raise BackendUnavailable(self.backend_id, "closed the connection without answering")
        return answer

    async def _read(
        self,
        response: httpx2.Response,
        request_id: Any,
        session: BackendSession | None,
        asked: list[str | int],
        lacked: dict[str, Any],
        position: StreamPosition,
    ) -> dict[str, Any] | None:
        """Read one answer (a whole body, or a stream until it ends): the request's result, or None
        when the stream ended before it."""
        messages = streamed(response, position)
        async for answer in messages:
            if not isinstance(answer, dict):
                continue
            if answer.get("id") == request_id and "method" not in answer:
                if lacked:
                    raise self._lacking(lacked)
                await finished(messages)
                return self._result(answer)
            if "method" in answer and "id" in answer:
                if await self.exchange.pass_on(self.backend_id, session, answer, self.timeout):
                    asked.append(answer["id"])
                elif lacks := await self._refuse(answer, session):
                    lacked[lacks] = {}
            else:
                await self.exchange.forward(answer)
        return None

    async def _abandon(self, asked: list[str | int], session: BackendSession | None) -> None:
        """Tell the backend that its requests passed on to the client will not be answered through
        this call, which ended first (best effort, bounded; an answer that came already stands)."""
        error = {"code": INTERNAL_ERROR, "message": "the call ended before the client answered this request"}
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABANDON_TIMEOUT):
            for request_id in asked:
                try:
                    await self._post({"jsonrpc": "2.0", "id": request_id, "error": error}, session)
                except (BackendError, httpx2.HTTPError) as exc:
                    logger.debug("backend %s: an unanswered request stays open: %s", self.backend_id, exc)
                    return

    async def respond(self, answer: Mapping[str, Any], session: BackendSession) -> None:
        """Post the client's answer to one of the backend's requests inside its session."""
        await self._post(answer, session)

    async def _refuse(self, request: Mapping[str, Any], session: BackendSession | None) -> str:
        """Answer a backend's request of its client with an error naming it (docs/gateway.md says why).

        Returns the capability the request needs if the client did not declare it, else "".
        """
        method = str(request.get("method", ""))
        needs = ANSWERABLE.get(method, "")
        lacks = needs if needs and self.exchange.declared.lacks(needs) else ""
        message = (
            f"toolsearch does not relay {method} to its clients: the client of this call cannot answer it"
        )
        if lacks:
            message = f"the client of this call did not declare the {lacks} capability {method} needs"
        error = {"code": METHOD_NOT_FOUND, "message": message}
        try:
            await self._post({"jsonrpc": "2.0", "id": request.get("id"), "error": error}, session)
        except BackendError as exc:
            logger.debug("backend %s: refusing its %s failed: %s", self.backend_id, method, exc)
        return lacks

    def _lacking(self, lacked: Mapping[str, Any]) -> CapabilityMissing:
        named = ", ".join(sorted(lacked))
        return CapabilityMissing(
            self.backend_id,
            f"this request needs the client's {named} capability, which the client did not declare: "
            "declare it (initialize's capabilities; in 2026-07-28, each request's _meta) to use it",
            lacked,
        )

    def _result(self, answer: Mapping[str, Any]) -> dict[str, Any]:
        if isinstance(error := answer.get("error"), dict):
            raise answered(self.backend_id, error)
        result = answer.get("result")
        if not isinstance(result, dict):
            raise BackendError(self.backend_id, "answered with something that is not a result")
        return result

    async def initialize(self) -> BackendSession:
        """Open a backend session: `initialize`, then `notifications/initialized` inside it."""
        params = {
            "protocolVersion": LATEST_HANDSHAKE_VERSION,
            # what the client can answer, so a backend asks only what will be answered: on the
            # call's stream, or as an input round when the call can ask its client so
            "capabilities": self.exchange.offered_in_session,
            "clientInfo": client_info(ROUTER_CLIENT_NAME),
        }
        self._next_id += 1
        message = {"jsonrpc": "2.0", "id": self._next_id, "method": "initialize", "params": params}
        response = await self._post(message, None)
        try:
            answers = messages_of(response)
        except ValueError:
            raise BackendError(
                self.backend_id, "answered initialize with something that is not JSON"
            ) from None
        result = next((a.get("result") for a in answers if isinstance(a, dict) and "result" in a), None)
        if not isinstance(result, dict):
            error = next((a.get("error") for a in answers if isinstance(a, dict) and "error" in a), None)
            detail = f": {error.get('message', '')}" if isinstance(error, dict) else ""
            raise BackendError(self.backend_id, f"refused to initialize a session{detail}")
        # a backend without sessions (stateless) answers without the header: the session is then only
        # the negotiated version, and later calls carry that alone
        version = str(result.get("protocolVersion") or LATEST_HANDSHAKE_VERSION)
        session = BackendSession(response.headers.get(SESSION_HEADER, ""), version)
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        capabilities = result.get("capabilities")
        level = self.exchange.declared.session_level
        if level and session.session_id and isinstance(capabilities, dict) and "logging" in capabilities:
            await self.set_level(level, session)  # the level the client set before this session opened
        return session

    async def set_level(self, level: str, session: BackendSession) -> None:
        """Pass a client's `logging/setLevel` on inside a backend session; a refusal is logged only."""
        try:
            await self.request("logging/setLevel", {"level": level}, session)
        except BackendError as exc:
            logger.debug("backend %s: passing on a log level failed: %s", self.backend_id, exc)

    async def notify(self, method: str, params: Mapping[str, Any], session: BackendSession) -> None:
        """Send a notification inside a session; raises the router errors above."""
        await self._post({"jsonrpc": "2.0", "method": method, "params": dict(params)}, session)

    async def terminate(self, session: BackendSession) -> None:
        """End a backend session (DELETE); a failure is the backend's idle timeout's to mend."""
        try:
            await self.http.delete(self.url, headers=self._headers(session))
        except httpx2.HTTPError:
            return
