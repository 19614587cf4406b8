"""A caller's token exchanged at a backend's token endpoint (OAuth 2.0 Token Exchange, RFC 8693).

One POST per exchange: the caller's token as the `subject_token`, the backend's `audience` and
`scopes`, and our client authenticated with HTTP Basic (RFC 6749 §2.3.1) from the variables the
configuration names. The whole exchange (connecting, TLS, the answer) has `auth.timeout` seconds, and
the answer at most `MAX_ANSWER_BYTES`: an endpoint that hangs, trickles or floods costs one bounded
wait. Redirects are not followed: the form carries a secret and a token.

What the endpoint answers becomes a token or one of two errors (indexer/errors.py):
`ExchangeRefused` when it refused the caller (the stored credentials' rules then apply, as to a
backend's 401 or 403) and `ExchangeFailed` for everything else, our own client's refusal included.
Messages name the endpoint without its query, and hold neither token nor secret: an error
description that repeats either is left out.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx2

from indexer.errors import ExchangeFailed, ExchangeRefused
from toolsearch.sections.backend_settings import Backend, BackendAuth

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"
MAX_ANSWER_BYTES = 64 * 1024  # a token answer is a few kB; more is not one
# RFC 8693 §2.2.2 answers invalid_request for a subject token it cannot accept; others invalid_grant
_REFUSED_TOKEN = frozenset({"invalid_grant", "invalid_request", "invalid_token"})
_REFUSED_TARGET = frozenset({"invalid_target", "invalid_scope", "access_denied"})
_ERROR_CODE = re.compile(r"[a-z_]{1,64}")
_DESCRIPTION_CHARS = 200


@dataclass(frozen=True, slots=True)
class Exchanged:
    """A token minted for a backend, and how many seconds it lives (as answered, or assumed)."""

    token: str
    lifetime: float


def where(url: str) -> str:
    """The endpoint as messages name it: scheme, host, port and path, no credentials or query."""
    parsed = httpx2.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


def _verify(ca_file: Path | None) -> ssl.SSLContext | bool:
    if ca_file is None:
        return True
    return ssl.create_default_context(cafile=str(ca_file))


def _tls_failure(exc: BaseException) -> str | None:
    """The certificate problem behind a connection failure, if that is what it was."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen.verify_message or "certificate verify failed"
        if isinstance(seen, ssl.SSLError):
            return seen.reason or "TLS handshake failed"
        seen = seen.__cause__ or seen.__context__
    return None


class TokenEndpoints:
    """Exchanges tokens at the backends' endpoints; one HTTP client per set of trusted certificates."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self._secrets = secrets
        self._clients: dict[Path | None, httpx2.AsyncClient] = {}
        self.exchanges = 0  # exchanges that gave a token, for status and tests

    def _client(self, backend: Backend) -> httpx2.AsyncClient:
        ca_file = backend.auth.ca_file
        client = self._clients.get(ca_file)
        if client is None:
            try:
                verify = _verify(ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise self._failed(backend, f"its ca_file {ca_file} cannot be read ({exc})") from None
            transport = httpx2.AsyncHTTPTransport(verify=verify)
            client = self._clients[ca_file] = httpx2.AsyncClient(transport=transport, follow_redirects=False)
        return client

    def _client_credentials(self, backend: Backend) -> tuple[str, str]:
        auth = backend.auth
        names = (auth.client_id_env or "", auth.client_secret_env or "")
        values = tuple(self._secrets.get(name, "") for name in names)
        if unset := [name for name, value in zip(names, values, strict=True) if not value]:
            raise self._failed(
                backend,
                f"its client's credentials are not set: set the environment variable {' and '.join(unset)}",
            )
        return values[0], values[1]

    def _failed(self, backend: Backend, reason: str) -> ExchangeFailed:
        return ExchangeFailed(
            backend.id, f"the token exchange at {where(backend.auth.token_url or '')} failed: {reason}"
        )

    async def exchange(self, backend: Backend, subject_token: str) -> Exchanged:
        """A token for `backend` in exchange for the caller's `subject_token`; never logged.

        Raises `ExchangeRefused` when the endpoint refuses the caller, `ExchangeFailed` otherwise.
        """
        auth = backend.auth
        client_id, client_secret = self._client_credentials(backend)
        client = self._client(backend)
        form = {
            "grant_type": GRANT_TYPE,
            "subject_token": subject_token,
            "subject_token_type": ACCESS_TOKEN,
            "requested_token_type": ACCESS_TOKEN,
            "audience": auth.audience or "",
        }
        if auth.scopes:
            form["scope"] = " ".join(auth.scopes)
        basic = (quote(client_id, safe=""), quote(client_secret, safe=""))
        try:
            async with asyncio.timeout(auth.timeout):
                status, content_type, body = await _post(client, auth.token_url or "", form, basic)
        except TimeoutError:
            raise self._failed(backend, f"it did not answer within {auth.timeout:g}s") from None
        except httpx2.HTTPError as exc:
            tls = _tls_failure(exc)
            reason = (
                f"its TLS certificate does not verify ({tls})"
                if tls
                else f"it cannot be reached ({type(exc).__name__})"
            )
            raise self._failed(backend, reason) from None
        if body is None:
            raise self._failed(backend, f"it answered more than {MAX_ANSWER_BYTES} bytes")
        exchanged = self._read(backend, status, content_type, body, (subject_token, client_secret))
        self.exchanges += 1
        return exchanged

    def _read(
        self, backend: Backend, status: int, content_type: str, body: bytes, secrets: tuple[str, str]
    ) -> Exchanged:
        """The token an answer carries, or the error it means."""
        answer = _json_object(content_type, body)
        if answer is None:
            kind = content_type.split(";", maxsplit=1)[0].strip() or "no content type"
            raise self._failed(backend, f"it answered HTTP {status} ({kind}), not a token response")
        if status != 200:
            raise self._refusal(backend, status, answer, secrets)
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise self._failed(backend, "its answer has no access_token")
        token_type = answer.get("token_type")
        if not isinstance(token_type, str) or token_type.lower() != "bearer":
            raise self._failed(backend, f"it issued a token of type {str(token_type)[:40]!r}, not Bearer")
        lifetime = _lifetime(answer.get("expires_in"), backend.auth)
        if lifetime is None:
            raise self._failed(backend, "its expires_in is not a number of seconds")
        return Exchanged(token, lifetime)

    def _refusal(
        self, backend: Backend, status: int, answer: Mapping[str, object], secrets: tuple[str, str]
    ) -> ExchangeFailed | ExchangeRefused:
        code = answer.get("error")
        if not isinstance(code, str) or not _ERROR_CODE.fullmatch(code):
            return self._failed(backend, f"it answered HTTP {status} without an OAuth error code")
        said = _description(answer.get("error_description"), secrets)
        url = where(backend.auth.token_url or "")
        if code in _REFUSED_TOKEN:
            reason = f"the token endpoint {url} refused the caller's token ({code}{said}): sign in again"
            return ExchangeRefused(backend.id, 401, reason)
        if code in _REFUSED_TARGET:
            reason = f"the token endpoint {url} refused the caller a token for this backend ({code}{said})"
            return ExchangeRefused(backend.id, 403, reason)
        if code in ("invalid_client", "unauthorized_client"):
            variables = f"{backend.auth.client_id_env} and {backend.auth.client_secret_env}"
            return self._failed(backend, f"it refused our client ({code}{said}): check {variables}")
        return self._failed(backend, f"it answered {code}{said}")

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()


async def _post(
    client: httpx2.AsyncClient, url: str, form: Mapping[str, str], basic: tuple[str, str]
) -> tuple[int, str, bytes | None]:
    """POST the form; the status, content type and body (None: larger than `MAX_ANSWER_BYTES`)."""
    headers = {"Accept": "application/json", "Cache-Control": "no-store"}
    async with client.stream("POST", url, data=dict(form), auth=basic, headers=headers) as response:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_ANSWER_BYTES:
                return response.status_code, "", None
        return response.status_code, response.headers.get("content-type", ""), bytes(body)


def _json_object(content_type: str, body: bytes) -> dict[str, object] | None:
    if "json" not in content_type.lower():
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _lifetime(expires_in: object, auth: BackendAuth) -> float | None:
    """Seconds a token lives: `expires_in` (a number, or digits as some servers send it), or assumed."""
    if expires_in is None:
        return auth.assumed_lifetime
    if isinstance(expires_in, str) and expires_in.isdigit():
        return float(expires_in)
    if isinstance(expires_in, int | float) and not isinstance(expires_in, bool) and 0 <= expires_in < 1e9:
        return float(expires_in)
    return None


def _description(value: object, secrets: tuple[str, str]) -> str:
    """An endpoint's error description for a message: short, printable, and holding no secret."""
    if not isinstance(value, str) or not value:
        return ""
    if any(secret and secret in value for secret in secrets):
        return ""
    text = "".join(c if c.isprintable() else " " for c in value[:_DESCRIPTION_CHARS])
    return f": {text}"
