"""`toolsearch health grpc|http` and `python -m commands.health_check`: exit 0 exactly when healthy."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from commands.cli import build_parser, main
from commands.ports import free_port


@pytest.fixture(scope="module")
def grpc_health() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


class _Answers(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = int(self.path.strip("/") or 200)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def http_base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_grpc_serving_exits_0(grpc_health: tuple[str, health.HealthServicer]) -> None:
    address, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert main(["health", "grpc", address]) == 0


def test_grpc_not_serving_exits_1_and_says_so(
    grpc_health: tuple[str, health.HealthServicer], capsys: pytest.CaptureFixture[str]
) -> None:
    address, servicer = grpc_health
    servicer.set("toolsearch.v1.Indexer", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert main(["health", "grpc", address, "--service", "toolsearch.v1.Indexer"]) == 1
    assert "NOT_SERVING" in capsys.readouterr().err


def test_grpc_nothing_listening_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "grpc", f"127.0.0.1:{free_port()}", "--timeout", "0.5"]) == 1
    assert "no answer (UNAVAILABLE)" in capsys.readouterr().err


def test_http_200_exits_0(http_base: str) -> None:
    assert main(["health", "http", f"{http_base}/200"]) == 0


@pytest.mark.parametrize("status", [503, 404, 204])
def test_http_anything_but_200_exits_1(
    http_base: str, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["health", "http", f"{http_base}/{status}"]) == 1
    assert f"HTTP {status}" in capsys.readouterr().err


def test_http_nothing_listening_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "http", f"http://127.0.0.1:{free_port()}/readyz", "--timeout", "0.5"]) == 1
    assert "no answer" in capsys.readouterr().err


def test_http_needs_an_http_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "http", "127.0.0.1:8000/readyz"]) == 1
    assert "not an http:// or https:// URL" in capsys.readouterr().err


def test_a_kind_is_required() -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser("health").parse_args(["health"])
    assert exit_info.value.code == 2


def test_the_health_command_loads_no_service() -> None:
    # a healthcheck runs every few seconds: only the health module is imported for it
    code = (
        "import sys; from commands.cli import build_parser; build_parser('health'); "
        "services = ('torch', 'indexer.api.server', 'router.frontdoor.app', 'fastapi'); "
        "print(sorted(m for m in services if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "commands.health_check", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_health_module_exits_0_for_a_serving_grpc_service(
    grpc_health: tuple[str, health.HealthServicer],
) -> None:
    address, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert run_module("grpc", address).returncode == 0


def test_the_health_module_exits_1_with_the_reason_when_unhealthy(http_base: str) -> None:
    result = run_module("http", f"{http_base}/503")
    assert result.returncode == 1
    assert "HTTP 503" in result.stderr
    gone = run_module("grpc", f"127.0.0.1:{free_port()}", "--timeout", "0.5")
    assert gone.returncode == 1 and "no answer (UNAVAILABLE)" in gone.stderr


def test_the_health_module_exits_2_on_a_usage_error() -> None:
    result = run_module("ftp", "somewhere")
    assert result.returncode == 2 and "usage: python -m commands.health_check" in result.stderr


def test_the_health_module_skips_the_command_lines_set_up(http_base: str) -> None:
    # what makes it cheap: neither the CLI, the configuration's modules nor a web framework is loaded
    code = (
        "import sys; from commands.health_check import main; "
        f"code = main(['http', '{http_base}/200']); "
        "print(code, sorted(m for m in ('commands.cli', 'toolsearch.config', 'yaml', 'starlette', "
        "'torch', 'grpc') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "0 []"
