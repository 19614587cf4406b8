"""Fuzzing the router with generated bad requests: no 5xx for a client's mistake, no crash, no hang.

Each test sends its examples to one real router (with the real indexer and catalog server behind it,
all served from the test's process), the token test to a second one in jwt mode; the last test
checks how many requests went out in all and that a normal request still works. Besides malformed
messages and headers, the examples include what the front door refuses: rebinding Host and Origin
values, bodies around the size limit and the bound up to which an oversized one is drained, and
tokens whose claims have any type.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commands.ports import free_port
from tests.support.in_process import hosted, in_process_stack, serve_router
from tests.support.stack import INITIALIZE, Stack, open_session
from toolsearch.config import load_config

EXAMPLES = 900  # per test; six tests make more than 5,000 requests
SECRET = "fuzzing-secret-long-enough-for-hs256-tokens"
ISSUER = "https://issuer.fuzz"
TIMEOUT = 15.0  # seconds: a request that takes longer counts as a hang
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same requests every run: a failure here is reproducible
)
FRONT_DOOR = settings(FUZZ, max_examples=300)  # the front door's shapes: fewer, some are large
sent = {"requests": 0}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
methods = st.sampled_from(
    ["tools/call", "tools/list", "initialize", "ping", "resources/list", "prompts/get", "", "tools/explode"]
) | st.text(max_size=30)
# printable ASCII without surrounding blanks: what an HTTP client can send at all
header_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80).map(
    str.strip
)
ids = st.none() | st.integers() | st.text(max_size=10) | st.floats(allow_nan=False) | st.lists(st.integers())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with in_process_stack(tmp_path_factory.mktemp("fuzz")) as running:
        yield running


@pytest.fixture(scope="module")
def jwt_router(stack: Stack) -> Iterator[str]:
    """A second router on the same indexer, in jwt mode; yields its /mcp URL."""
    auth = {"mode": "jwt", "issuer": ISSUER, "audience": "toolsearch", "hs256_secret_env": "FUZZ_JWT"}
    port = free_port()
    config = {
        **stack.config,
        "router": {**stack.config["router"], "auth": auth, "listen": f"127.0.0.1:{port}"},
    }
    path = stack.workdir / "jwt.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    secrets = {"FUZZ_JWT": SECRET}
    with hosted(functools.partial(serve_router, load_config(path, secrets), f"127.0.0.1:{port}", secrets)):
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def http() -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=TIMEOUT) as client:
        yield client


@pytest.fixture(scope="module")
def session_id(stack: Stack) -> str:
    return open_session(stack.mcp_url)


def send(
    http: httpx2.Client, url: str, content: bytes, headers: dict[str, str], method: str = "POST"
) -> httpx2.Response:
    sent["requests"] += 1
    response = http.request(method, url, content=content, headers=headers)
    assert response.status_code < 500, (response.status_code, content[:200], headers, response.text[:300])
    if response.status_code >= 400 and response.content:
        body = response.json()  # every error has a JSON-RPC body that says what was wrong
        assert body["error"]["message"], body
    return response


def base_headers(session_id: str) -> dict[str, str]:
    return {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2025-11-25",
        "Mcp-Session-Id": session_id,
    }


@FUZZ
@given(body=st.binary(max_size=300))
def test_random_bytes_get_a_clear_error(
    stack: Stack, http: httpx2.Client, session_id: str, body: bytes
) -> None:
    send(http, stack.mcp_url, body, base_headers(session_id))


@FUZZ
@given(value=json_values)
def test_json_that_is_not_jsonrpc_gets_a_clear_error(
    stack: Stack, http: httpx2.Client, session_id: str, value: Any
) -> None:
    send(http, stack.mcp_url, json.dumps(value).encode(), base_headers(session_id))


@FUZZ
@given(method=methods, request_id=ids, params=json_values, version=st.sampled_from(["2.0", "1.0", 2, None]))
def test_wrong_jsonrpc_shapes_and_unknown_methods_get_a_clear_error(
    stack: Stack,
    http: httpx2.Client,
    session_id: str,
    method: Any,
    request_id: Any,
    params: Any,
    version: Any,
) -> None:
    message = {"jsonrpc": version, "id": request_id, "method": method, "params": params}
    send(http, stack.mcp_url, json.dumps(message).encode(), base_headers(session_id))


@FUZZ
@given(
    tool=st.sampled_from(["find_tool", "call_tool", "Search_by_name", ""]) | st.text(max_size=20),
    arguments=st.dictionaries(
        st.sampled_from(["tool_description", "tool_keywords", "limit", "tool_name", "parameters", "x"]),
        json_values,
        max_size=5,
    )
    | json_values,
)
def test_wrong_meta_tool_arguments_are_answered(
    stack: Stack, http: httpx2.Client, session_id: str, tool: str, arguments: Any
) -> None:
    message = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    response = send(http, stack.mcp_url, json.dumps(message).encode(), base_headers(session_id))
    assert response.status_code == 200, response.text
    assert "result" in response.json() or "error" in response.json()


@FUZZ
@given(
    content_type=st.sampled_from(["text/plain", "application/xml", "", "application/json; charset=latin-1"])
    | header_values,
    accept=st.sampled_from(["", "text/html", "*/*", "application/json"]),
    session=header_values,
    version=st.sampled_from(["", "2025-11-25", "2026-07-28", "1999-01-01", "garbage"]),
    http_method=st.sampled_from(["POST", "DELETE", "GET", "PUT", "PATCH"]),
)
def test_bad_headers_and_session_ids_get_a_clear_error(
    stack: Stack,
    http: httpx2.Client,
    content_type: str,
    accept: str,
    session: str,
    version: str,
    http_method: str,
) -> None:
    headers = {"Content-Type": content_type, "Accept": accept, "Mcp-Session-Id": session}
    if version:
        headers["MCP-Protocol-Version"] = version
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    send(http, stack.mcp_url, body, {k: v for k, v in headers.items() if v}, http_method)


@FUZZ
@given(depth=st.integers(min_value=1, max_value=100_000), size=st.integers(min_value=0, max_value=3_000_000))
def test_huge_and_deeply_nested_bodies_are_refused_or_answered(
    stack: Stack, http: httpx2.Client, session_id: str, depth: int, size: int
) -> None:
    nested = "[" * depth + "]" * depth
    padding = "x" * size
    body = f'{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"a":{nested},"b":"{padding}"}}}}'
    send(http, stack.mcp_url, body.encode(), base_headers(session_id))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", maxsplit=1)[0])


hosts = st.sampled_from(
    ["localhost", "127.0.0.1", "[::1]", "evil.example", "LOCALHOST", "127.0.0.2"]
).flatmap(
    lambda name: st.sampled_from([name, f"{name}:PORT", f"{name}:1", f"{name}:"])
) | header_values.filter(bool)
origins = st.none() | st.sampled_from(["null", "http://", "file://"]) | hosts.map(lambda h: f"http://{h}")


@settings(FRONT_DOOR)
@given(host=hosts, origin=origins)
def test_rebinding_hosts_and_origins_are_refused_or_served(
    stack: Stack, http: httpx2.Client, session_id: str, host: str, origin: str | None
) -> None:
    port = str(_port(stack.mcp_url))
    headers = {**base_headers(session_id), "Host": host.replace("PORT", port)}
    if origin is not None:
        headers["Origin"] = origin.replace("PORT", port)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    response = send(http, stack.mcp_url, body, headers)
    assert response.status_code in (200, 403), response.text
    if "evil.example" in headers["Host"]:
        assert response.status_code == 403 and "router.allowed_hosts" in response.text


LIMIT = 1_048_576  # router.max_body_bytes's default; oversized bodies are drained up to 4 times it


@settings(FRONT_DOOR, max_examples=60)
@given(
    size=st.sampled_from([LIMIT - 200, LIMIT + 1, 2 * LIMIT, 4 * LIMIT - 100, 4 * LIMIT + 10_000])
    | st.integers(min_value=0, max_value=5 * LIMIT),
    chunked=st.booleans(),
)
def test_bodies_around_the_limit_are_answered_in_full(
    stack: Stack, http: httpx2.Client, session_id: str, size: int, chunked: bool
) -> None:
    body = f'{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"b":"{"x" * size}"}}}}'.encode()
    content: Any = iter([body[i : i + 65536] for i in range(0, len(body), 65536)]) if chunked else body
    try:
        response = send(http, stack.mcp_url, content, base_headers(session_id))
    except httpx2.TransportError:
        # beyond the drain bound the router answers and closes while the body is still coming
        assert len(body) > 4 * LIMIT, len(body)
        return
    assert response.status_code == (413 if len(body) > LIMIT else 200), response.text[:300]


def _token(claims: dict[str, Any]) -> str:
    """An HS256 JWT of any claims: pyjwt refuses to encode some of the shapes fuzzed here."""

    def part(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signed = part(b'{"alg":"HS256","typ":"JWT"}') + b"." + part(json.dumps(claims).encode())
    signature = hmac.new(SECRET.encode(), signed, hashlib.sha256).digest()
    return (signed + b"." + part(signature)).decode()


numbers = st.integers() | st.floats(allow_nan=True, allow_infinity=True)
claim_values = json_values | numbers | st.just(float("inf"))


@settings(FRONT_DOOR)
@given(
    claims=st.fixed_dictionaries(
        {},
        optional={
            "exp": claim_values | st.just(int(time.time()) + 3600),
            "nbf": claim_values,
            "iat": claim_values,
            "iss": claim_values | st.just(ISSUER),
            "sub": claim_values | st.just("fuzzer"),
            "aud": claim_values | st.just("toolsearch") | st.just(["toolsearch", "other"]),
        },
    )
)
def test_tokens_with_claims_of_any_type_are_refused_or_served(
    jwt_router: str, http: httpx2.Client, claims: dict[str, Any]
) -> None:
    headers = {**base_headers(""), "Authorization": f"Bearer {_token(claims)}"}
    headers.pop("Mcp-Session-Id")
    response = send(http, jwt_router, json.dumps(INITIALIZE).encode(), headers)
    assert response.status_code in (200, 401, 429), response.text[:300]
    if response.status_code == 401:
        assert response.json()["error"]["message"].startswith("invalid token: ")


def test_the_router_still_answers_a_normal_request_after_the_fuzzing(
    stack: Stack, http: httpx2.Client, session_id: str
) -> None:
    assert sent["requests"] >= 5000
    message = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "find_tool", "arguments": {"tool_description": "cocktail recipes", "limit": 2}},
    }
    response = send(http, stack.mcp_url, json.dumps(message).encode(), base_headers(session_id))
    assert len(response.json()["result"]["structuredContent"]["tools"]) == 2
