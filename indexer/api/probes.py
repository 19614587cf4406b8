"""The indexer's HTTP port for probes and scrapes: `/healthz`, `/readyz`, `/metrics` (indexer.health_listen).

The gRPC port may demand mutual TLS of every connection (`indexer.tls`), which the kubelet's gRPC
probe cannot present, so the probes and Prometheus come to a plain HTTP port of their own instead.
It says nothing a caller could use: whether the process is alive and ready, and the metric families
(indexer/api/metrics.py), whose labels never name a session or a tool.

- `/healthz`: 200 while the event loop answers within `LIVENESS_TIMEOUT` seconds; a loop stuck for
  longer (a blocking call, a deadlock) answers 503, and the kubelet restarts the container.
- `/readyz`: 200 from the moment the gRPC server serves until its shutdown begins (the same moment
  its gRPC health service says NOT_SERVING); 503 while it starts (the model loads, every tool is
  embedded) and while it drains.
- any other path: the Prometheus text exposition, as the metrics endpoint always answered.

The server runs on a thread of its own, so a busy event loop delays no answer but the liveness one,
which is its point.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

LIVENESS_TIMEOUT = 5.0  # seconds the event loop has to answer /healthz
CLOSE_TIMEOUT = 5.0  # seconds `close` waits for the serving thread

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _Quiet(WSGIRequestHandler):
    """No line per request: the kubelet probes every few seconds."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _json(start_response: StartResponse, status: str, body: dict[str, str]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


class ProbeEndpoint:
    """A running HTTP endpoint for probes and scrapes (its own thread); `close` stops it."""

    def __init__(self, listen: str, registry: CollectorRegistry, loop: asyncio.AbstractEventLoop) -> None:
        self.ready = False  # set by the server once it serves, cleared when its shutdown begins
        self._loop = loop
        self._metrics: WsgiApp = make_wsgi_app(registry)
        host, _, port = listen.rpartition(":")
        # an IPv6 listen address is written [::]:9464; the socket takes the bare address
        family, _, _, _, address = socket.getaddrinfo(
            host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]

        class Server(ThreadingWSGIServer):
            address_family = family

        try:
            self._server: WSGIServer = make_server(
                str(address[0]), int(port), self._app, Server, handler_class=_Quiet
            )
        except OSError as exc:
            message = f"indexer.health_listen: cannot listen on {listen} ({exc.strerror})"
            raise OSError(exc.errno, message) from None
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(target=self._server.serve_forever, name="probes", daemon=True)
        self._thread.start()
        print(f"indexer health and metrics on http://{host}:{self.port}", file=sys.stderr, flush=True)

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            problem = self._liveness_problem()
            if problem is None:
                return _json(start_response, "200 OK", {"status": "ok"})
            return _json(start_response, "503 Service Unavailable", {"status": "not ok", "reason": problem})
        if path == "/readyz":
            if self.ready:
                return _json(start_response, "200 OK", {"status": "ready"})
            reason = "starting or stopping: the gRPC server does not serve now"
            return _json(start_response, "503 Service Unavailable", {"status": "not ready", "reason": reason})
        return self._metrics(environ, start_response)

    def _liveness_problem(self) -> str | None:
        async def answer() -> None:
            return None

        try:
            asyncio.run_coroutine_threadsafe(answer(), self._loop).result(LIVENESS_TIMEOUT)
        except TimeoutError:
            return f"the event loop did not answer within {LIVENESS_TIMEOUT:g} s"
        except RuntimeError as exc:  # the loop is closed: the process is ending
            return f"the event loop is gone ({exc})"
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=CLOSE_TIMEOUT)
