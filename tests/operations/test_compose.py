"""docker-compose.yml and the Dockerfile agree with the CLI and the configuration, checked without Docker.

Every command and healthcheck is parsed by the real `toolsearch` parser; the configuration file the
containers read is loaded with the environment compose gives them; ports, addresses and mounts are
compared with what that configuration says. Container paths map back to the repository through the
Dockerfile's COPY lines and the services' bind mounts.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from commands.cli import build_parser
from commands.health_check import standalone_parser
from router.link.channels import channel_options
from toolsearch.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
TOOLSEARCH_SERVICES = ("catalog", "indexer", "router")
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: Any) -> Any:
    """Compose's `${VAR:-default}` with an empty shell environment: every variable takes its default."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: m.group(2) or "", value).replace("$$", "$")
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


COMPOSE: dict[str, Any] = interpolate(yaml.safe_load(COMPOSE_FILE.read_text()))
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def final_stage() -> list[str]:
    """The Dockerfile's instructions after its last FROM, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    last_from = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return lines[last_from:]


def path_pairs(service: dict[str, Any]) -> list[tuple[PurePosixPath, Path]]:
    """(container path, repository path) for every bind mount and every COPY of the final stage."""
    pairs = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            pairs.append((PurePosixPath(target), ROOT / source))
    for line in final_stage():
        words = shlex.split(line)
        if words[0] == "COPY" and not any(w.startswith("--from") for w in words):
            *sources, target = [w for w in words[1:] if not w.startswith("--")]
            assert len(sources) == 1, line
            pairs.append((PurePosixPath(target), ROOT / sources[0]))
    return pairs


def to_repo(service: dict[str, Any], container_path: str) -> Path:
    """The repository file a container path comes from."""
    path = PurePosixPath(container_path)
    for target, source in path_pairs(service):
        if path == target or target in path.parents:
            return source / path.relative_to(target)
    raise AssertionError(f"{container_path} is neither copied into the image nor mounted")


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def parse(command: list[str]) -> argparse.Namespace:
    """A command line as `toolsearch` would parse it; fails the test on a usage error."""
    try:
        return build_parser(command[0]).parse_args(command)
    except SystemExit as exc:
        raise AssertionError(f"toolsearch {' '.join(command)}: usage error") from exc


def config_of(name: str) -> Config:
    service = SERVICES[name]
    path = to_repo(service, parse(service["command"]).config)
    assert path.is_file(), path
    return load_config(path, environment(service))


def port(address: str) -> int:
    return int(address.rpartition(":")[2])


HEALTH_MODULE = ["python", "-m", "commands.health_check"]


def health_check(name: str) -> argparse.Namespace:
    """A service's healthcheck as `python -m commands.health_check` parses it; fails on a usage error."""
    test = SERVICES[name]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1:4] == HEALTH_MODULE, test
    try:
        return standalone_parser().parse_args(test[4:])
    except SystemExit as exc:
        raise AssertionError(f"{' '.join(test[1:])}: usage error") from exc


def test_the_stack_has_redis_the_indexer_a_router_and_a_catalog_server() -> None:
    assert set(SERVICES) >= {"redis", *TOOLSEARCH_SERVICES}
    assert SERVICES["redis"]["image"].startswith("redis:7")
    assert SERVICES["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    for name in TOOLSEARCH_SERVICES:
        build = SERVICES[name]["build"]
        # the indexer's image is the Dockerfile's default; the router and catalog server use its
        # base-only image (ROLE=router)
        if name == "indexer":
            assert build == ".", name
        else:
            assert build == {"context": ".", "args": {"ROLE": "router"}}, name
    named = {
        v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", []) if not v.startswith(".")
    }
    assert named <= set(COMPOSE["volumes"])


@pytest.mark.parametrize("name", TOOLSEARCH_SERVICES)
def test_each_command_and_healthcheck_parses_with_the_cli(name: str) -> None:
    assert callable(parse(SERVICES[name]["command"]).func)
    assert callable(health_check(name).func)


def test_the_indexer_gets_the_redis_state_through_the_environment() -> None:
    env = environment(SERVICES["indexer"])
    assert env["TOOLSEARCH_INDEXER_STATE"] == "redis://redis:6379/0"
    assert config_of("indexer").indexer.state == "redis://redis:6379/0"
    depends = SERVICES["indexer"]["depends_on"]
    assert depends["redis"]["condition"] == "service_healthy"
    assert depends["catalog"]["condition"] == "service_healthy"
    assert SERVICES["router"]["depends_on"]["indexer"]["condition"] == "service_healthy"


def test_the_indexer_scales_no_fixed_name_no_host_port() -> None:
    indexer = SERVICES["indexer"]
    assert "container_name" not in indexer
    assert "ports" not in indexer
    config = config_of("indexer").indexer
    assert config.listen.startswith("0.0.0.0:")
    assert config.health_listen is not None and config.health_listen.startswith("0.0.0.0:")
    exposed = {int(p) for p in indexer["expose"]}
    assert exposed == {port(config.listen), port(config.health_listen)}


def test_routers_reach_every_indexer_replica_round_robin() -> None:
    router, indexer = config_of("router"), config_of("indexer")
    assert router.router.indexer == [f"dns:///indexer:{port(indexer.indexer.listen)}"]
    options = dict(channel_options(router.router.indexer[0]))
    assert "round_robin" in options["grpc.service_config"]


def test_the_router_publishes_its_listen_port() -> None:
    config = config_of("router").router
    assert config.listen.startswith("0.0.0.0:")
    (mapping,) = SERVICES["router"]["ports"]
    published, _, container = mapping.rpartition(":")
    assert int(container) == port(config.listen)
    assert published == "127.0.0.1:8000"  # loopback unless TOOLSEARCH_ROUTER_PUBLISH says otherwise


def test_the_catalog_service_serves_what_the_config_registers() -> None:
    catalog = SERVICES["catalog"]
    args = parse(catalog["command"])
    (server,) = config_of("indexer").catalog_servers
    host, _, listen_port = server.listen.rpartition(":")
    assert host == "catalog" and int(listen_port) == args.port
    assert args.host == "0.0.0.0"
    assert to_repo(catalog, str(args.catalog)) == server.catalog == ROOT / "examples" / "catalog.jsonl"
    assert [int(p) for p in catalog["expose"]] == [args.port]
    assert not args.control  # the control API has no authentication


def test_healthchecks_ask_the_address_each_service_listens_on() -> None:
    indexer = health_check("indexer")
    assert indexer.kind == "grpc"
    assert indexer.target == f"127.0.0.1:{port(config_of('indexer').indexer.listen)}"
    router = health_check("router")
    assert router.kind == "http"
    assert router.target == f"http://127.0.0.1:{port(config_of('router').router.listen)}/readyz"
    catalog = health_check("catalog")
    assert catalog.target == f"http://127.0.0.1:{parse(SERVICES['catalog']['command']).port}/healthz"


def test_healthchecks_run_the_health_module_from_the_images_virtualenv() -> None:
    # `python` must be the virtualenv's, where the installed `commands` package lives
    stage = final_stage()
    assert any(line.startswith("ENV PATH=/opt/venv/bin:$PATH") for line in stage), stage
    assert not any(line.startswith(("WORKDIR /app/commands", "COPY commands")) for line in stage)
    names = [name for name, service in SERVICES.items() if name != "redis"]
    assert names and all(SERVICES[name]["healthcheck"]["test"][1:4] == HEALTH_MODULE for name in names)


def test_the_model_is_mounted_read_only_and_the_cache_is_a_named_volume() -> None:
    indexer = SERVICES["indexer"]
    assert "./models:/app/models:ro" in indexer["volumes"]
    config = config_of("indexer").indexer
    assert config.model == ROOT / "models" / "all-MiniLM-L6-v2-tools"
    assert to_repo(indexer, "/app/models/all-MiniLM-L6-v2-tools") == config.model
    cache = [v for v in indexer["volumes"] if v.split(":")[1] == str(config.cache_dir)]
    assert cache and not cache[0].startswith(("./", "/")), "the embedding cache needs a named volume"


@pytest.mark.parametrize("name", ["indexer", "router"])
def test_services_log_json_lines(name: str) -> None:
    assert parse(SERVICES[name]["command"]).log_format == "json"


def test_the_image_is_multi_stage_slim_and_runs_toolsearch_unprivileged() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    # the base: a pinned Python release on a named Debian release, slim (never a moving tag)
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.MULTILINE)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base[1]), base
    assert len(stages) >= 2 and stages[0].startswith("${PYTHON_IMAGE}") and stages[-1] == "${PYTHON_IMAGE}"
    final = final_stage()
    assert 'ENTRYPOINT ["toolsearch"]' in final
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^RUN pip install \.", text, re.MULTILINE)


def test_the_image_pins_the_torch_of_pyproject() -> None:
    pinned = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    image = re.search(r"^ARG TORCH_VERSION=(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert pinned and image and image.group(1) == pinned.group(1)
    assert "download.pytorch.org/whl/cpu" in DOCKERFILE.read_text()


def test_the_build_context_leaves_out_models_and_virtualenvs() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"models", ".venv", ".git"} <= set(ignored)


def test_the_bridge_serves_the_stdio_backends_the_indexer_and_router_reach_by_its_name() -> None:
    bridge = SERVICES["bridge"]
    assert bridge["build"] == {"context": ".", "args": {"ROLE": "bridge"}}
    assert parse(bridge["command"]).command == "bridge"
    config = config_of("bridge")
    assert [b.id for b in config.backends if b.stdio] == ["time"]
    assert config.bridge.listen.startswith("0.0.0.0:")
    assert [int(p) for p in bridge["expose"]] == [port(config.bridge.listen)]
    for name in ("indexer", "router"):
        (time,) = (b for b in config_of(name).backends if b.stdio)
        assert time.url == f"http://bridge:{port(config.bridge.listen)}/time/mcp"
    assert SERVICES["indexer"]["depends_on"]["bridge"]["condition"] == "service_healthy"
    health = health_check("bridge")
    assert health.target == f"http://127.0.0.1:{port(config.bridge.listen)}/readyz"


def test_the_bridges_image_installs_the_program_of_each_stdio_backend() -> None:
    servers = re.search(r'^ARG STDIO_SERVERS="([^"]*)"', DOCKERFILE.read_text(), re.MULTILINE)
    assert servers, "the bridge's stage names the stdio servers it installs"
    packages = {requirement.split("==")[0] for requirement in servers.group(1).split()}
    for backend in config_of("bridge").backends:
        if backend.stdio:
            assert backend.command in packages, backend.command  # each installs a command of its name
