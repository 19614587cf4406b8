"""A real OpenAI-compatible embedding server for tests: Infinity on CPU, serving a model folder.

    server = EmbeddingServer(MODEL, "all-MiniLM-L6-v2-tools", api_key="...")
    server.start()              # returns once /health answers; server.url is the API's base URL
    ...
    server.stop()               # and start() again, on the same port, with the same or another model

`make setup` installs Infinity into a virtualenv of its own (`.venv-infinity`,
scripts/embedding-server-requirements.txt); without it the tests that need it are skipped, saying
why. It runs offline: the model is a local folder, and no hub or usage report is ever reached.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commands.ports import free_port
from tests.support.processes import Proc, start_process

ROOT = Path(__file__).resolve().parents[2]
INFINITY = ROOT / ".venv-infinity" / "bin" / "infinity_emb"
MODELS = ROOT / "models"
START_TIMEOUT = 240.0  # seconds: importing torch and loading the model on a busy 2-core machine
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    "DO_NOT_TRACK": "1",
    "OMP_NUM_THREADS": "1",  # one core of the two: the rest of the test suite runs beside it
}


def require_infinity() -> None:
    if not INFINITY.exists():
        pytest.skip("the embedding server (Infinity) is not installed: `make setup` installs it")


class EmbeddingServer:
    """Infinity serving one model folder under a name, on a port kept across restarts."""

    def __init__(self, model: Path, served_name: str, api_key: str | None = None) -> None:
        require_infinity()
        self.model = model
        self.served_name = served_name
        self.api_key = api_key
        self.port = free_port()
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        """The API's base URL, as `indexer.embedder.url` takes it."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, model: Path | None = None, served_name: str | None = None) -> None:
        """Start it (again) on its port; another model and name make a model swapped behind one URL."""
        self.model = model or self.model
        self.served_name = served_name or self.served_name
        args = [
            str(INFINITY),
            "v2",
            "--model-id",
            str(self.model),
            "--served-model-name",
            self.served_name,
            "--engine",
            "torch",
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--url-prefix",
            "/v1",
            "--no-model-warmup",
            "--log-level",
            "warning",
        ]
        if self.api_key:
            args += ["--api-key", self.api_key]
        self.proc = start_process(
            args, f"http://127.0.0.1:{self.port}/health", timeout=START_TIMEOUT, env=OFFLINE
        )

    def stop(self) -> str:
        proc, self.proc = self.proc, None
        return proc.stop() if proc is not None else ""
