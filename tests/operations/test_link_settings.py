"""The link's settings and checks, without processes: secrets, PEM files, the guard, the arguments limit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from indexer.api.access import SharedSecretGuard
from router.errors import InvalidRequest
from router.handlers.arguments import parse_call_tool
from tests.support.certs import Authority
from toolsearch.config import load_config
from toolsearch.transport import TransportConfigError, channel_security, server_security

SECRET = "s" * 40


def config(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "toolsearch.yaml"
    path.write_text(text)
    return load_config(path)


def test_the_new_limits_have_defaults(tmp_path: Path) -> None:
    loaded = config(tmp_path, "")
    assert loaded.router.max_arguments_bytes == 262_144 and loaded.router.open_session_timeout == 30.0
    assert loaded.indexer.max_sessions_per_principal == 100
    assert loaded.router.shutdown_grace == loaded.indexer.shutdown_grace == 10.0
    plain = channel_security(loaded.router, {})
    assert plain.credentials is None and not plain.metadata
    assert server_security(loaded.indexer, {}) == server_security(loaded.indexer, {"X": "y"})


def test_tls_paths_resolve_against_the_configuration_folder(tmp_path: Path) -> None:
    loaded = config(
        tmp_path,
        "indexer:\n  tls: {cert: pki/i.pem, key: pki/i.key, client_ca: pki/ca.pem}\n"
        "router:\n  indexer_tls: {ca: pki/ca.pem, cert: pki/r.pem, key: pki/r.key, server_name: indexer}\n",
    )
    assert loaded.indexer.tls.client_ca == tmp_path / "pki" / "ca.pem"
    assert loaded.router.indexer_tls.key == tmp_path / "pki" / "r.key"


def test_a_missing_or_short_secret_stops_the_start_naming_the_key(tmp_path: Path) -> None:
    loaded = config(tmp_path, "router: {indexer_secret_env: LINK}\nindexer: {shared_secret_env: LINK}\n")
    with pytest.raises(TransportConfigError, match=r"router\.indexer_secret_env: .* LINK is not set"):
        channel_security(loaded.router, {})
    with pytest.raises(TransportConfigError, match=r"indexer\.shared_secret_env: .* at least 32 bytes"):
        server_security(loaded.indexer, {"LINK": "short"})
    security = channel_security(loaded.router, {"LINK": SECRET})
    assert security.metadata == (("authorization", f"Bearer {SECRET}"),)
    assert SECRET not in repr(security)
    assert SECRET not in repr(server_security(loaded.indexer, {"LINK": SECRET}))


def test_unreadable_or_non_pem_files_stop_the_start(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate")
    loaded = config(tmp_path, "router:\n  indexer_tls: {ca: ca.pem, cert: missing.pem, key: missing.key}\n")
    with pytest.raises(TransportConfigError, match=r"router\.indexer_tls\.ca: .* is not a PEM file"):
        channel_security(loaded.router, {})
    authority = Authority.create("unit CA")
    authority.write(tmp_path / "ca.pem")
    with pytest.raises(TransportConfigError, match=r"router\.indexer_tls\.key: cannot read"):
        channel_security(loaded.router, {})


def test_pem_files_give_tls_credentials_and_a_name_override(tmp_path: Path) -> None:
    authority = Authority.create("unit CA")
    authority.write(tmp_path / "ca.pem")
    authority.issue(tmp_path, "indexer", server=True)
    authority.issue(tmp_path, "router")
    loaded = config(
        tmp_path,
        "indexer:\n  tls: {cert: indexer.pem, key: indexer.key, client_ca: ca.pem}\n"
        "router:\n  indexer_tls: {ca: ca.pem, cert: router.pem, key: router.key, server_name: indexer}\n",
    )
    client = channel_security(loaded.router, {})
    assert isinstance(client.credentials, grpc.ChannelCredentials)
    assert client.options == (("grpc.ssl_target_name_override", "indexer"),)
    assert isinstance(server_security(loaded.indexer, {}).credentials, grpc.ServerCredentials)


@pytest.mark.parametrize(
    ("metadata", "allowed"),
    [
        ((("authorization", f"Bearer {SECRET}"),), True),
        ((("authorization", f"bearer {SECRET}"),), True),
        (
            (("x-request-id", "1"), ("authorization", "Bearer nope"), ("authorization", f"Bearer {SECRET}")),
            True,
        ),
        ((("authorization", f"Bearer {SECRET}x"),), False),
        ((("authorization", SECRET),), False),
        ((("authorization", f"Basic {SECRET}"),), False),
        ((("authorization-bin", SECRET.encode()),), False),
        ((), False),
        (None, False),
    ],
)
def test_the_guard_lets_in_only_the_shared_secret(metadata: Any, allowed: bool) -> None:
    guard = SharedSecretGuard(SECRET)
    assert guard.presented(metadata) is allowed
    assert SECRET not in repr(guard)


async def test_the_guard_refuses_with_a_handler_of_the_same_shape_and_leaves_health_open() -> None:
    guard = SharedSecretGuard(SECRET)
    handler = grpc.stream_stream_rpc_method_handler(lambda requests, context: iter(()))

    async def continuation(details: Any) -> Any:
        return handler

    def details(method: str) -> Any:
        return SimpleNamespace(method=method, invocation_metadata=())

    refused = await guard.intercept_service(continuation, details("/grpc.reflection.v1alpha.X/Info"))
    assert refused is not handler and refused.request_streaming and refused.response_streaming
    assert await guard.intercept_service(continuation, details("/grpc.health.v1.Health/Check")) is handler


def test_call_tool_parameters_over_the_limit_are_refused_naming_it() -> None:
    assert parse_call_tool({"tool_name": "t", "parameters": {"a": "x" * 50}}, max_bytes=64).parameters
    with pytest.raises(InvalidRequest, match=r"too large: 108 bytes of JSON, and the limit is 64 bytes"):
        parse_call_tool({"tool_name": "t", "parameters": {"a": "x" * 100}}, max_bytes=64)
    # the size is of UTF-8 text, as forwarded, not of escaped ASCII
    with pytest.raises(InvalidRequest, match=r"too large: 208 bytes"):
        parse_call_tool({"tool_name": "t", "parameters": {"a": "é" * 100}}, max_bytes=64)
