"""The indexer's gRPC port refuses callers without its shared secret or a client certificate; no secret leaks.

Two stacks of real processes. The first protects the port with a shared secret and adds a `header`
backend: a second catalog server requires a JWT on Cocktails, and the backend sends that JWT from an
environment variable. Every process logs at debug level, so the last test of that stack can look for
the secrets in everything they wrote. The second stack uses mutual TLS with certificates made here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx2
import jwt
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from mcp import Client

from commands.health_check import check_grpc
from commands.ports import free_port
from commands.status import fetch
from tests.support.catalogs import small_catalog
from tests.support.certs import Authority
from tests.support.processes import Proc, start_process
from tests.support.stack import CLI, HEADERS, INITIALIZE, Stack, running_stack, structured
from toolsearch.config import load_config
from toolsearch.transport import channel_security
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc as pb_grpc

DEBUG = ["--log-level", "debug"]
LINK_SECRET = "link-secret-0123456789-abcdefghijklmnopqrstuvwxyz"
JWT_SECRET = "vault-jwt-secret-long-enough-for-hs256-0123"
VAULT_JWT = jwt.encode({"sub": "toolsearch", "exp": int(time.time()) + 3600}, JWT_SECRET, algorithm="HS256")
SECRET_ENV = {
    "TS_TEST_LINK_SECRET": LINK_SECRET,
    "TS_TEST_VAULT_TOKEN": f"Bearer {VAULT_JWT}",
    "TOOLSEARCH_CATALOG_JWT_SECRET": JWT_SECRET,
}


@dataclass
class Secured:
    stack: Stack
    vault: Proc  # the catalog server behind the header backend
    vault_url: str


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("secret")
    catalog, vault_catalog = folder / "catalog.jsonl", folder / "vault.jsonl"
    small_catalog(catalog, ("Free NBA", "AI Weather by Meteosource"))
    small_catalog(vault_catalog, ("Cocktails",))
    port = free_port()
    vault_url = f"http://127.0.0.1:{port}"
    command = [*CLI, "catalog-server", "--catalog", str(vault_catalog), "--port", str(port), "--control"]
    vault = start_process(
        [*command, "--require-jwt", "Cocktails", *DEBUG],
        f"{vault_url}/healthz",
        env=SECRET_ENV,
    )
    extra: dict[str, Any] = {
        "router": {"indexer_secret_env": "TS_TEST_LINK_SECRET"},
        "indexer": {"shared_secret_env": "TS_TEST_LINK_SECRET"},
        "backends": [
            {
                "id": "Vault",
                "url": f"{vault_url}/servers/Cocktails/mcp",
                "auth": {"type": "header", "header": "Authorization", "value_env": "TS_TEST_VAULT_TOKEN"},
            }
        ],
    }
    try:
        with running_stack(
            folder,
            catalog=catalog,
            extra=extra,
            env=SECRET_ENV,
            catalog_args=DEBUG,
            service_args=DEBUG,
        ) as stack:
            yield Secured(stack, vault, vault_url)
    finally:
        vault.stop()


def status_code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    code: grpc.StatusCode = raised.value.code()
    return code


async def test_with_the_shared_secret_the_stack_serves_and_calls_the_header_backend(secured: Secured) -> None:
    async with Client(secured.stack.mcp_url, mode="legacy") as client:
        found = structured(await client.call_tool("find_tool", {"tool_description": "cocktail recipe"}))
        assert "Search_by_name" in {tool["name"] for tool in found["tools"]}
        result = await client.call_tool(
            "call_tool", {"tool_name": "Search_by_name", "parameters": {"name": "mojito"}}
        )
    assert not result.is_error, result
    assert structured(result) == {
        "tool": "Search_by_name",
        "server": "Cocktails",
        "arguments": {"name": "mojito"},
    }
    calls = httpx2.get(f"{secured.vault_url}/control/servers/Cocktails/calls", timeout=5).json()
    assert calls["calls"] == 1  # the static header reached the backend and was accepted


def test_the_indexer_refuses_every_call_without_its_secret_but_answers_health_probes(
    secured: Secured,
) -> None:
    address = secured.stack.indexer_address
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.IndexerStub(channel)
        for metadata in (None, [("authorization", "Bearer wrong-secret")], [("authorization", LINK_SECRET)]):
            assert status_code(lambda m=metadata: stub.Status(pb.StatusRequest(), metadata=m, timeout=5)) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
        opening = pb.OpenSessionRequest(principal=pb.Principal())
        assert status_code(lambda: stub.OpenSession(opening, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        listing = reflection_pb2.ServerReflectionRequest(list_services="")
        assert status_code(lambda: list(reflection.ServerReflectionInfo(iter([listing]), timeout=5))) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    security = channel_security(load_config(secured.stack.config_path).router, SECRET_ENV)
    assert fetch(address, 5.0, security).backends  # the same call with the secret is answered


def test_a_router_without_the_secret_gets_no_session_and_says_why(secured: Secured) -> None:
    config = dict(secured.stack.config)
    config["router"] = {k: v for k, v in config["router"].items() if k != "indexer_secret_env"}
    path = secured.stack.workdir / "no-secret.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    router = start_process(
        [*CLI, "router", "--config", str(path), *DEBUG],
        f"http://127.0.0.1:{port}/healthz",
        env={**SECRET_ENV, "TOOLSEARCH_ROUTER_LISTEN": f"127.0.0.1:{port}"},
    )
    try:
        response = httpx2.post(f"http://127.0.0.1:{port}/mcp", json=INITIALIZE, headers=HEADERS, timeout=10)
    finally:
        output = router.stop()
    assert response.status_code == 502 and "UNAUTHENTICATED" in response.json()["error"]["message"]
    assert "refused this router's credentials" in output
    assert LINK_SECRET not in output and VAULT_JWT not in output


def test_no_secret_appears_in_any_log_line_or_answer(secured: Secured) -> None:
    stack = secured.stack
    session = httpx2.post(stack.mcp_url, json=INITIALIZE, headers=HEADERS, timeout=10)
    wrong = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "call_tool", "arguments": {"tool_name": "Search_by_name", "parameters": {}}},
    }
    headers = {**HEADERS, "Mcp-Session-Id": session.headers["mcp-session-id"]}
    refused = httpx2.post(stack.mcp_url, json=wrong, headers=headers, timeout=10)  # schema violation
    assert refused.json()["result"]["isError"] is True
    answers = session.text + refused.text
    logs = "\n".join(proc.output() for proc in [*stack.procs.values(), secured.vault])
    assert " DEBUG " in logs and "refused a call to /toolsearch.v1.Indexer/Status" in logs
    signature = VAULT_JWT.rsplit(".", 1)[1]
    for secret in (LINK_SECRET, VAULT_JWT, signature, JWT_SECRET):
        assert secret not in logs and secret not in answers


# mutual TLS


@dataclass
class Mutual:
    stack: Stack
    folder: Path
    ca: Path


@pytest.fixture(scope="module")
def mutual(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mutual]:
    folder = tmp_path_factory.mktemp("mtls")
    authority = Authority.create("toolsearch test CA")
    ca = authority.write(folder / "ca.pem")
    server_cert, server_key = authority.issue(folder, "indexer", server=True)
    client_cert, client_key = authority.issue(folder, "router")
    rogue = Authority.create("someone else's CA")
    rogue.issue(folder, "rogue")
    catalog = folder / "catalog.jsonl"
    small_catalog(catalog)
    extra = {
        "indexer": {"tls": {"cert": str(server_cert), "key": str(server_key), "client_ca": str(ca)}},
        "router": {"indexer_tls": {"ca": str(ca), "cert": str(client_cert), "key": str(client_key)}},
    }
    with running_stack(folder, catalog=catalog, extra=extra) as stack:
        yield Mutual(stack, folder, ca)


def tls_status(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with channel:
        stub = pb_grpc.IndexerStub(channel)
        return status_code(lambda: stub.Status(pb.StatusRequest(), timeout=5))


async def test_with_mutual_tls_the_stack_serves(mutual: Mutual) -> None:
    async with Client(mutual.stack.mcp_url, mode="legacy") as client:
        found = structured(await client.call_tool("find_tool", {"tool_description": "basketball teams"}))
        assert found["tools"]
        result = await client.call_tool("call_tool", {"tool_name": "Get_All_Teams", "parameters": {}})
    assert not result.is_error, result
    security = channel_security(load_config(mutual.stack.config_path).router, {})
    assert fetch(mutual.stack.indexer_address, 5.0, security).backends
    assert check_grpc(mutual.stack.indexer_address, config=str(mutual.stack.config_path)) is None


def test_without_a_certificate_its_ca_signed_no_connection_is_made(mutual: Mutual) -> None:
    address, folder = mutual.stack.indexer_address, mutual.folder
    ca = mutual.ca.read_bytes()
    attempts = {
        "plaintext": None,
        "no client certificate": grpc.ssl_channel_credentials(root_certificates=ca),
        "another CA's certificate": grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(folder / "rogue.key").read_bytes(),
            certificate_chain=(folder / "rogue.pem").read_bytes(),
        ),
    }
    for what, credentials in attempts.items():
        assert tls_status(address, credentials) == grpc.StatusCode.UNAVAILABLE, what
    assert check_grpc(address) is not None  # the health service is behind the TLS handshake too
