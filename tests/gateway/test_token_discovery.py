"""How a client finds where to get a token: RFC 9728 metadata, pointed at by every 401 in jwt mode.

A real router in `jwt` mode (tests/support/routers.py). The round trip is the MCP SDK's own OAuth
client: refused, it follows `resource_metadata` to the router's document, discovers the
authorization server it names, registers, is authorized and exchanges the code for a token, then
initializes and calls a tool with that token. The authorization server is a test double in the
client's transport: it issues real HS256 tokens the router verifies.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import jwt
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)

from router.frontdoor.app import create_app
from tests.support.routers import LightStack, light_stack
from tests.support.stack import HEADERS, INITIALIZE
from toolsearch.config import parse_config

ISSUER = "https://auth.test"  # the authorization server, and the issuer of the tokens
SECRET = "token-discovery-secret-long-enough-for-hs256"
JWT_MODE = {
    "mode": "jwt",
    "issuer": ISSUER,
    "audience": "toolsearch",
    "hs256_secret_env": "TS_DISCOVERY_JWT",
    "scopes": ["tools"],
}
ENV = {"TS_DISCOVERY_JWT": SECRET}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LightStack]:
    async with light_stack(tmp_path_factory.mktemp("tokens"), router={"auth": JWT_MODE}, env=ENV) as running:
        yield running


def token(**claims: Any) -> str:
    now = int(time.time())
    payload = {"iss": ISSUER, "aud": "toolsearch", "sub": "alice", "iat": now, "exp": now + 600, **claims}
    return jwt.encode(payload, SECRET, algorithm="HS256")


def resource_metadata_url(response: httpx2.Response) -> str:
    match = re.search(r'resource_metadata="([^"]+)"', response.headers["www-authenticate"])
    assert match, response.headers["www-authenticate"]
    return match.group(1)


async def test_every_401_points_at_the_metadata_document(stack: LightStack) -> None:
    async with httpx2.AsyncClient(timeout=10) as http:
        missing = await http.post(stack.mcp_url, json=INITIALIZE, headers=HEADERS)
        expired = await http.post(
            stack.mcp_url,
            json=INITIALIZE,
            headers={**HEADERS, "Authorization": f"Bearer {token(exp=int(time.time()) - 600)}"},
        )
        for refused in (missing, expired):
            assert refused.status_code == 401
            url = resource_metadata_url(refused)
            assert url == f"{stack.router_url}/.well-known/oauth-protected-resource/mcp"
            document = await http.get(url)
            assert document.status_code == 200
            metadata = ProtectedResourceMetadata.model_validate_json(document.content)
            assert str(metadata.resource) == stack.mcp_url
            assert [str(s) for s in metadata.authorization_servers] == [ISSUER]
            assert metadata.bearer_methods_supported == ["header"] and metadata.scopes_supported == ["tools"]
        assert 'error="invalid_token"' in expired.headers["www-authenticate"]
        root = await http.get(f"{stack.router_url}/.well-known/oauth-protected-resource")
        assert root.json() == document.json()


def refused_with_urllib(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers=HEADERS, method="POST")
    try:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10)
    except urllib.error.HTTPError as exc:
        assert "resource_metadata=" in exc.headers["www-authenticate"]
        return exc.code
    raise AssertionError("a request without a token was let in")


async def test_a_large_body_without_a_token_still_gets_its_401(stack: LightStack) -> None:
    # refused before the body is read: read and dropped first, so urllib sees the 401, not a reset
    body = json.dumps({**INITIALIZE, "pad": "x" * 2_000_000}).encode()
    codes = [await asyncio.to_thread(refused_with_urllib, stack.mcp_url, body) for _ in range(5)]
    assert codes == [401] * 5


def test_an_anonymous_router_has_no_metadata() -> None:
    app = create_app(parse_config({}, Path("toolsearch.yaml")), {})
    assert not [route for route in app.routes if "well-known" in getattr(route, "path", "")]


@pytest.mark.parametrize(
    ("claims", "problem"),
    [
        ({"exp": "9999999999"}, "exp claim must be a number"),
        ({"nbf": "0"}, "nbf claim must be a number"),
        ({"iat": [1]}, "iat claim must be a number"),
        ({"sub": 42}, "sub claim must be a string"),
        ({"aud": ["toolsearch", 7]}, "aud claim must be a string or a list of strings"),
    ],
)
async def test_claims_of_the_wrong_type_are_refused_with_the_reason(
    stack: LightStack, claims: dict[str, Any], problem: str
) -> None:
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(
            stack.mcp_url, json=INITIALIZE, headers={**HEADERS, "Authorization": f"Bearer {token(**claims)}"}
        )
    assert response.status_code == 401
    assert problem in response.json()["error"]["message"]
    assert problem in response.headers["www-authenticate"]


class AuthorizationServer(httpx2.AsyncBaseTransport):
    """https://auth.test in the client's transport: metadata, registration, token; the rest goes out."""

    def __init__(self) -> None:
        self._out = httpx2.AsyncHTTPTransport()
        self.seen: list[str] = []
        self.resource: str | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.host != "auth.test":
            return await self._out.handle_async_request(request)
        self.seen.append(request.url.path)
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx2.Response(
                200,
                json={
                    "issuer": ISSUER,
                    "authorization_endpoint": f"{ISSUER}/authorize",
                    "token_endpoint": f"{ISSUER}/token",
                    "registration_endpoint": f"{ISSUER}/register",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                },
            )
        if request.url.path == "/register":
            registration = json.loads(await request.aread())
            return httpx2.Response(201, json={**registration, "client_id": "test-client"})
        if request.url.path == "/token":
            form = parse_qs((await request.aread()).decode())
            self.resource = form.get("resource", [None])[0]
            return httpx2.Response(
                200, json={"access_token": token(), "token_type": "Bearer", "expires_in": 600}
            )
        return httpx2.Response(404)

    async def aclose(self) -> None:
        await self._out.aclose()


class Memory:
    """The client's token storage."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def test_the_sdks_oauth_client_finds_the_authorization_server_and_gets_in(stack: LightStack) -> None:
    redirected: list[str] = []

    async def redirect(url: str) -> None:
        redirected.append(url)  # a person would sign in here

    async def callback() -> AuthorizationCodeResult:
        state = parse_qs(urlsplit(redirected[-1]).query)["state"][0]
        return AuthorizationCodeResult(code="the-code", state=state)

    metadata = OAuthClientMetadata.model_validate(
        {"client_name": "test", "redirect_uris": ["http://localhost:3030/callback"]}
    )
    provider = OAuthClientProvider(stack.mcp_url, metadata, Memory(), redirect, callback)
    server = AuthorizationServer()
    http = httpx2.AsyncClient(auth=provider, transport=server, timeout=10)
    async with http, Client(streamable_http_client(stack.mcp_url, http_client=http), mode="legacy") as client:
        found = await client.call_tool("find_tool", {"tool_description": "cocktail recipes"})
    assert not found.is_error
    assert server.seen == ["/.well-known/oauth-authorization-server", "/register", "/token"]
    assert parse_qs(urlsplit(redirected[0]).query)["scope"] == ["tools"]  # from the document
    assert server.resource == stack.mcp_url  # RFC 8707: the token was asked for this resource
