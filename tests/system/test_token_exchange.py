"""Token exchange for backends (RFC 8693) end to end, and the caller's token going to passthrough only.

Real processes: a token endpoint of our own on Authlib (tests/support/token_endpoint.py) serving TLS
with a test CA, backends that verify the tokens they get or record them (tests/support/
token_backend.py), a catalog server and two routers in jwt mode. The indexer runs in the test's loop
(tests/support/routers.py), so its log lines are captured and its sessions inspected. Callers use
the SDK's client; each test has subjects of its own, so the endpoint's exchanges of a subject are
that test's. Every wait polls a condition with a bound.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from commands.ports import free_port
from indexer.backends.backend_tokens import BackendTokens
from indexer.backends.token_exchange import TokenEndpoints
from indexer.state.redis import Keys
from indexer.state.tokens import RedisTokens
from router.errors import ExchangeFailed
from router.link.indexer_client import IndexerClient
from tests.support.certs import Authority
from tests.support.clients import until
from tests.support.processes import Proc, start_process
from tests.support.redis import RedisServer
from tests.support.routers import LightStack, another_router, light_stack
from tests.support.stack import CLI, wait_until
from tests.support.token_endpoint import ISSUER as ENDPOINT_ISSUER
from toolsearch.sections.backend_settings import Backend
from toolsearch.sessions import Principal
from toolsearch.sessions import Principal as Caller

SECRET = "a-test-secret-that-is-long-enough-for-hs256"  # the callers' tokens: routers and endpoint
ISSUER = "https://login.test"
CLIENT_ID, CLIENT_SECRET = "toolsearch-gateway", "the-gateway's-client-secret"
VAULT_KEY = "vault-static-key-value"
EXCHANGE_TIMEOUT = 4.0
# seconds a token lives when a test needs it to lapse soon: long enough for a call on a busy machine
# to use it before it expires, short enough that the wait for the next exchange stays brief
SHORT_LIFETIME = 8
ASSUMED_LIFETIME = 4.0
ENDED = "ended session: backends rejected its stored credentials"


def caller_token(subject: str) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": "toolsearch", "sub": subject, "iat": now, "exp": now + 600}
    return jwt.encode(claims, SECRET, algorithm="HS256")


@dataclass
class World:
    stack: LightStack
    routers: list[str]  # both routers' /mcp URLs
    endpoint: str
    backends: str
    ca_file: Path
    procs: list[Proc]

    def trusting(self) -> httpx2.Client:
        """A client that trusts the test CA, for the endpoint's controls."""
        return httpx2.Client(verify=ssl.create_default_context(cafile=str(self.ca_file)), timeout=5)

    def post(self, url: str, **params: Any) -> Any:
        with self.trusting() as http:
            response = http.post(url, params=params)
        response.raise_for_status()
        return response.json()

    def endpoint_control(self, what: str, **params: Any) -> None:
        self.post(f"{self.endpoint}/control/{what}", **params)

    def backend_control(self, what: str, **params: Any) -> None:
        self.post(f"{self.backends}/control/{what}", **params)

    def exchanges(self, subject: str) -> int:
        with self.trusting() as http:
            subjects = http.get(f"{self.endpoint}/control/exchanges").json()["subjects"]
        return int(subjects.count(subject))

    def seen(self, backend: str) -> list[str]:
        response = httpx2.get(f"{self.backends}/control/seen", params={"backend": backend}, timeout=5)
        return list(response.json()["values"])

    def logs(self) -> str:
        return "\n".join(proc.output() for proc in self.procs)

    @contextmanager
    def fault(self, mode: str) -> Iterator[None]:
        """The endpoint in `mode` for the block; then as it was, tokens living 300 s."""
        self.endpoint_control("mode", mode=mode)
        try:
            yield
        finally:
            self.endpoint_control("mode", mode="normal")
            self.endpoint_control("lifetime", seconds=300)


def write_keys(folder: Path) -> tuple[Path, Path]:
    """The endpoint's signing key (EC P-256) and its public half, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = folder / "signing.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public = folder / "signing.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def exchange_auth(endpoint: str, audience: str, ca_file: Path | None) -> dict[str, Any]:
    return {
        "type": "token_exchange",
        "token_url": f"{endpoint}/token",
        "audience": audience,
        "scopes": ["crm.read"],
        "client_id_env": "CRM_CLIENT_ID",
        "client_secret_env": "CRM_CLIENT_SECRET",
        "ca_file": str(ca_file) if ca_file else None,
        "timeout": EXCHANGE_TIMEOUT,
        "assumed_lifetime": ASSUMED_LIFETIME,
    }


def start_endpoint(folder: Path, signing: Path, authority: Authority) -> tuple[Proc, str]:
    cert, key = authority.issue(folder, "tokens", server=True)
    port = free_port()
    env = {
        "CLIENT_ID": CLIENT_ID,
        "CLIENT_SECRET": CLIENT_SECRET,
        "SUBJECT_SECRET": SECRET,
        "SUBJECT_ISSUER": ISSUER,
        "SUBJECT_AUDIENCE": "toolsearch",
    }
    args = ["--port", str(port), "--signing-key", str(signing), "--cert", str(cert), "--key", str(key)]
    proc = start_process([CLI[0], "-m", "tests.support.token_endpoint", *args], None, env=env)
    url = f"https://127.0.0.1:{port}"
    trusted = ssl.create_default_context(cafile=str(folder / "ca.pem"))

    def answers() -> bool:
        try:
            return httpx2.get(f"{url}/healthz", verify=trusted, timeout=1).status_code == 200
        except httpx2.HTTPError:
            return False

    try:
        wait_until(answers, 30, proc)
    except BaseException:
        proc.stop()
        raise
    return proc, url


@pytest.fixture(scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    folder = tmp_path_factory.mktemp("exchange")
    signing, public = write_keys(folder)
    authority = Authority.create("test CA")
    ca_file = authority.write(folder / "ca.pem")
    async with AsyncExitStack() as cleanup:
        endpoint_proc, endpoint = await asyncio.to_thread(start_endpoint, folder, signing, authority)
        cleanup.callback(endpoint_proc.stop)
        port = free_port()
        kinds = ["crm=exchanged", "ledger=exchanged", "notes=open", "vault=open", "mail=open"]
        args = ["--port", str(port), "--public-key", str(public)]
        args += [part for kind in kinds for part in ("--backend", kind)]
        backend_proc = await asyncio.to_thread(
            start_process,
            [CLI[0], "-m", "tests.support.token_backend", *args],
            f"http://127.0.0.1:{port}/healthz",
        )
        cleanup.callback(backend_proc.stop)
        base = f"http://127.0.0.1:{port}"
        backends = [
            {"id": "crm", "url": f"{base}/crm/mcp", "auth": exchange_auth(endpoint, "crm", ca_file)},
            # no ca_file: the endpoint's certificate, signed by the test CA, does not verify
            {"id": "ledger", "url": f"{base}/ledger/mcp", "auth": exchange_auth(endpoint, "ledger", None)},
            {"id": "notes", "url": f"{base}/notes/mcp"},
            {
                "id": "vault",
                "url": f"{base}/vault/mcp",
                "auth": {"type": "header", "header": "X-Vault-Token", "value_env": "VAULT_KEY"},
            },
            {"id": "mail", "url": f"{base}/mail/mcp", "auth": {"type": "passthrough"}},
        ]
        env = {
            "ROUTER_JWT_KEY": SECRET,
            "CRM_CLIENT_ID": CLIENT_ID,
            "CRM_CLIENT_SECRET": CLIENT_SECRET,
            "VAULT_KEY": VAULT_KEY,
        }
        auth = {
            "mode": "jwt",
            "issuer": ISSUER,
            "audience": "toolsearch",
            "hs256_secret_env": "ROUTER_JWT_KEY",
        }
        health = {"enabled": True, "interval": 0.2, "timeout": 10.0, "unhealthy_after": 1}
        stack = await cleanup.enter_async_context(
            light_stack(
                folder,
                router={"auth": auth},
                env=env,
                backends=backends,
                indexer={"health": health},
                router_process=True,
            )
        )
        second, second_url = await asyncio.to_thread(another_router, stack, "second", {}, env)
        cleanup.callback(second.stop)
        procs = [endpoint_proc, backend_proc, stack.router, second]
        yield World(stack, [stack.mcp_url, f"{second_url}/mcp"], endpoint, base, ca_file, procs)


@asynccontextmanager
async def client(url: str, token: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    async with http, Client(streamable_http_client(url, http_client=http)) as connected:
        yield connected


async def call(connected: Client, tool: str) -> tuple[bool, str]:
    """call_tool on `tool`: whether it failed, and its text."""
    result = await connected.call_tool("call_tool", {"tool_name": tool, "parameters": {}})
    text = " ".join(getattr(part, "text", "") for part in result.content)
    return bool(result.is_error), text


def assert_never_logged(world: World, caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    logs = world.logs() + "\n".join(record.getMessage() for record in caplog.records)
    for secret in (*secrets, CLIENT_SECRET):
        assert secret not in logs


async def test_a_backend_gets_a_token_minted_for_its_audience_and_the_callers_subject_never_the_callers_own(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    token = caller_token("alice")
    async with client(world.routers[0], token) as alice:
        failed, text = await call(alice, "whoami_crm")
    assert not failed, text
    claims = json.loads(text)
    now = time.time()
    assert (claims["aud"], claims["sub"], claims["iss"]) == ("crm", "alice", ENDPOINT_ISSUER)
    assert now < claims["exp"] <= now + 300 + 5 and claims["scope"] == "crm.read"
    assert claims["act"] == {"sub": CLIENT_ID}  # the gateway, acting for alice (RFC 8693 §4.1)
    assert token not in world.seen("crm")
    assert_never_logged(world, caplog, token)


async def test_two_router_replicas_share_one_exchange_per_principal_and_backend(world: World) -> None:
    token = caller_token("bruno")
    subjects = []
    for url in (*world.routers, *world.routers):
        async with client(url, token) as bruno:
            failed, text = await call(bruno, "whoami_crm")
        assert not failed, text
        subjects.append(json.loads(text)["sub"])
    assert subjects == ["bruno"] * 4
    assert world.exchanges("bruno") == 1  # the session's listing exchanged it; four calls reused it


async def test_only_a_passthrough_backend_receives_the_callers_token(world: World) -> None:
    token = caller_token("carmen")
    async with client(world.routers[1], token) as carmen:
        for backend in ("crm", "notes", "vault", "mail"):
            failed, text = await call(carmen, f"whoami_{backend}")
            assert not failed, (backend, text)
    assert f"Bearer {token}" in world.seen("mail")
    # listings, probes and calls alike: nothing else ever got it, in any header
    for backend in ("crm", "ledger", "notes", "vault"):
        assert not any(token in value for value in world.seen(backend)), backend
    assert VAULT_KEY in world.seen("vault") and VAULT_KEY not in world.seen("notes")


async def test_an_endpoint_that_hangs_is_a_bounded_clear_tool_error_and_other_callers_go_on(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    other, hung = caller_token("dora"), caller_token("dmitri")
    async with client(world.routers[0], other) as dora, client(world.routers[1], hung) as dmitri:
        assert not (await call(dora, "whoami_crm"))[0]  # dora's token is kept for 270 s
        world.endpoint_control("lifetime", seconds=SHORT_LIFETIME)
        assert not (await call(dmitri, "whoami_crm"))[0]  # dmitri's for half its lifetime
        with world.fault("hang"):
            failing = asyncio.create_task(until(lambda: refused(dmitri, "whoami_crm"), "a failed exchange"))
            # while the endpoint hangs: another caller's calls, to the same backend too, and find_tool
            for tool in ("whoami_crm", "whoami_notes"):
                assert not (await call(dora, tool))[0]
            assert not (await dora.call_tool("find_tool", {"tool_description": "who am I"})).is_error
            took, text = await failing
    assert "backend crm" in text and f"did not answer within {EXCHANGE_TIMEOUT:g}s" in text, text
    assert EXCHANGE_TIMEOUT - 0.5 < took < EXCHANGE_TIMEOUT + 15  # the exchange's bound, not the router's
    assert_never_logged(world, caplog, other, hung)


async def refused(connected: Client, tool: str) -> tuple[float, str] | None:
    """How long a call took and its text, when it failed; None when it succeeded."""
    started = time.monotonic()
    failed, text = await call(connected, tool)
    return (time.monotonic() - started, text) if failed else None


async def test_an_endpoint_answering_html_is_a_clear_tool_error_naming_the_backend(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    token = caller_token("emil")
    async with client(world.routers[0], token) as emil:
        world.endpoint_control("lifetime", seconds=SHORT_LIFETIME)
        assert not (await call(emil, "whoami_crm"))[0]  # kept for half its lifetime
        with world.fault("html"):
            _, text = await until(lambda: refused(emil, "whoami_crm"), "the exchange met the HTML page")
        assert "backend crm" in text and "answered HTTP 502 (text/html), not a token response" in text
        assert f"{world.endpoint}/token" in text
        assert not (await call(emil, "whoami_crm"))[0]  # the endpoint is back: so is the backend
    assert_never_logged(world, caplog, token)


async def test_a_token_without_expires_in_is_kept_only_for_the_assumed_lifetime(world: World) -> None:
    token = caller_token("fiona")
    with world.fault("no_expires_in"):
        async with client(world.routers[1], token) as fiona:

            async def exchanged_again() -> bool:
                failed, text = await call(fiona, "whoami_crm")
                assert not failed, text
                return world.exchanges("fiona") >= 2

            await until(exchanged_again, "a second exchange", timeout=30)


async def test_a_token_endpoint_whose_certificate_does_not_verify_is_named_and_sessions_open_without_it(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    token = caller_token("gus")
    caplog.set_level(logging.INFO, logger="indexer")
    async with client(world.routers[0], token) as gus:
        assert not (await call(gus, "whoami_notes"))[0]
        assert not (await call(gus, "whoami_crm"))[0]
        tools = await gus.call_tool("find_tool", {"tool_description": "who am I", "limit": 20})
        assert "whoami_ledger" not in json.dumps(tools.structured_content)
    listed = [r.getMessage() for r in caplog.records if "backend ledger not listed" in r.getMessage()]
    assert listed and "its TLS certificate does not verify" in listed[0], listed
    indexer = IndexerClient([f"127.0.0.1:{world.stack.indexer.config.indexer.listen.rpartition(':')[2]}"], 10)
    try:
        with pytest.raises(ExchangeFailed, match=r"backend ledger: .* TLS certificate does not verify"):
            await indexer.exchange_token(Caller(ISSUER, "gus"), token, "ledger")
    finally:
        await indexer.close()
    assert token not in "\n".join(world.seen("ledger"))
    assert_never_logged(world, caplog, token)


async def test_a_backend_refusing_the_exchanged_token_gets_one_fresh_exchange_then_a_clear_error(
    world: World,
) -> None:
    token = caller_token("hana")
    async with client(world.routers[1], token) as hana:
        assert not (await call(hana, "whoami_crm"))[0]
        before = world.exchanges("hana")
        world.backend_control("refuse", backend="crm", subject="hana")
        failed, text = await call(hana, "whoami_crm")
        assert failed and text.startswith("backend crm rejected the credentials (HTTP 401)"), text
        assert world.exchanges("hana") == before + 1
        assert not (await call(hana, "whoami_notes"))[0]  # the session goes on


async def test_a_refused_exchange_counts_as_a_rejected_credential_and_ends_the_session_at_relisting(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    token = caller_token("ivan")
    indexer = world.stack.indexer
    principal = Principal(ISSUER, "ivan")
    async with client(world.routers[0], token) as ivan:
        assert not (await call(ivan, "whoami_crm"))[0]
        session_id = await indexer.state.sessions.implied(principal)
        world.endpoint_control("revoke", subject="ivan")
        world.backend_control("refuse", backend="crm", subject="ivan")  # the kept token is refused too
        failed, text = await call(ivan, "whoami_crm")
        assert failed and "refused the caller's token (invalid_grant" in text and "sign in again" in text
        # the backend goes down and recovers: the session lists it again, the exchange is refused
        for action, advertised in (("down", False), ("up", True)):
            world.backend_control(action, backend="crm")
            await until(
                lambda a=advertised: asyncio.sleep(0, indexer.registry.get("crm").advertised == a),
                f"crm advertised={advertised}",
            )
        await until(lambda: asyncio.sleep(0, ENDED in caplog.text), "the session ended")
        assert await indexer.state.sessions.load(session_id or "") is None
    assert_never_logged(world, caplog, token)


@pytest.fixture
def exchange_backend(world: World) -> Backend:
    return Backend.model_validate(
        {
            "id": "crm",
            "url": f"{world.backends}/crm/mcp",
            "auth": exchange_auth(world.endpoint, "crm", world.ca_file),
        }
    )


async def test_indexer_replicas_sharing_redis_exchange_once_per_principal_and_backend(
    world: World, redis_server: RedisServer, exchange_backend: Backend
) -> None:
    import redis.asyncio as aredis

    secrets = {"CRM_CLIENT_ID": CLIENT_ID, "CRM_CLIENT_SECRET": CLIENT_SECRET}
    plain = aredis.Redis.from_url(redis_server.url)
    replicas = [BackendTokens(TokenEndpoints(secrets), RedisTokens(plain, Keys())) for _ in range(2)]
    try:
        jana = Principal(ISSUER, "jana")
        first = await replicas[0].token_for(exchange_backend, jana, caller_token("jana"))
        second = await replicas[1].token_for(exchange_backend, jana, caller_token("jana"))
        assert first == second and world.exchanges("jana") == 1
        kept = [key async for key in plain.scan_iter("toolsearch:token:*")]
        assert len(kept) == 1 and b"jana" not in kept[0]
        assert 0 < await plain.ttl(kept[0]) <= 300 - 30
        # one replica, many requests at once: one exchange in flight
        kim = Principal(ISSUER, "kim")
        tokens = await asyncio.gather(
            *(replicas[0].token_for(exchange_backend, kim, caller_token("kim")) for _ in range(10))
        )
        assert len(set(tokens)) == 1 and world.exchanges("kim") == 1
    finally:
        for replica in replicas:
            await replica.aclose()
        await plain.aclose()
