"""The configuration file: one YAML document for the router, the indexer, backends and catalog servers.

Every key is documented in docs/configuration.md. `load_config` is the only reader: it validates
the file, resolves relative paths against the file's folder, applies `TOOLSEARCH_*` environment
overrides, and expands catalog servers into backends. A wrong or missing field raises `ConfigError`
naming the field and the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import ValidationError, field_validator, model_validator

from toolsearch.catalog import CatalogError, group_by_server, load_catalog
from toolsearch.sections.authorization_settings import Authorization
from toolsearch.sections.backend_settings import Backend, BackendAuth, Bridge, CatalogServer, bridge_url
from toolsearch.sections.indexer_settings import Indexer, IndexerClientTls, IndexerTls
from toolsearch.sections.mcp_servers import ServersFileError, read_servers_file
from toolsearch.sections.router_settings import Router
from toolsearch.sections.settings import Section


class ConfigError(ValueError):
    """Raised when the configuration file is missing, not YAML, or has a wrong or missing field."""


_TlsModel = TypeVar("_TlsModel", IndexerTls, IndexerClientTls)


class Config(Section):
    """The whole file."""

    router: Router = Router()
    indexer: Indexer = Indexer()
    bridge: Bridge = Bridge()
    backends: list[Backend] = []
    # mcpServers JSON files (Claude Desktop, Cursor, VS Code) whose servers become backends too
    backends_from: list[Path] = []
    catalog_servers: list[CatalogServer] = []
    authorization: Authorization | None = None  # who may use which tool (docs/authorization.md)

    @field_validator("backends_from", mode="before")
    @classmethod
    def _one_or_more(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _unique_backends(self) -> Config:
        seen: set[str] = set()
        for backend in self.backends:
            if backend.id in seen:
                raise ValueError(f"backend id {backend.id!r} is used twice")
            seen.add(backend.id)
        return self


def _format_error(exc: ValidationError, path: Path) -> str:
    lines = [f"{path}: invalid configuration"]
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key (see docs/configuration.md for the keys)"
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


_TLS_FOLDERS = {
    "TOOLSEARCH_INDEXER_TLS_DIR": (
        "indexer",
        "tls",
        {"cert": "tls.crt", "key": "tls.key", "client_ca": "ca.crt"},
    ),
    "TOOLSEARCH_ROUTER_INDEXER_TLS_DIR": (
        "router",
        "indexer_tls",
        {"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key"},
    ),
}


def _apply_env(raw: dict[str, object], env: Mapping[str, str]) -> None:
    """Environment overrides for what differs between machines: listen addresses and the indexer's."""
    overrides = {
        "TOOLSEARCH_ROUTER_LISTEN": ("router", "listen"),
        "TOOLSEARCH_ROUTER_HEALTH_LISTEN": ("router", "health_listen"),
        "TOOLSEARCH_INDEXER_LISTEN": ("indexer", "listen"),
        "TOOLSEARCH_INDEXER_STATE": ("indexer", "state"),
        "TOOLSEARCH_INDEXER_STATE_ACKS": ("indexer", "state_acks"),
        "TOOLSEARCH_INDEXER_CACHE_DIR": ("indexer", "cache_dir"),
        "TOOLSEARCH_INDEXER_MODEL": ("indexer", "model"),
        "TOOLSEARCH_INDEXER_MODEL_THREADS": ("indexer", "model_threads"),
        "TOOLSEARCH_INDEXER_EMBEDDER": ("indexer", "embedder"),
        "TOOLSEARCH_INDEXER_HEALTH_LISTEN": ("indexer", "health_listen"),
        "TOOLSEARCH_BRIDGE_LISTEN": ("bridge", "listen"),
        "TOOLSEARCH_BRIDGE_URL": ("bridge", "url"),
    }
    for name, (section, key) in overrides.items():
        if name in env:
            sub = raw.setdefault(section, {})
            if isinstance(sub, dict):
                sub[key] = env[name]
    # the link's certificates: a folder laid out as a kubernetes.io/tls Secret, as cert-manager
    # writes it (docs/kubernetes.md, "Mutual TLS on the link"); other keys (server_name) stay
    for name, (section, key, files) in _TLS_FOLDERS.items():
        if env.get(name):
            sub = raw.setdefault(section, {})
            if isinstance(sub, dict):
                kept = sub.get(key)
                paths = {field: str(Path(env[name]) / file) for field, file in files.items()}
                sub[key] = {**(kept if isinstance(kept, dict) else {}), **paths}
    if "TOOLSEARCH_INDEXER_ADDRESSES" in env:
        sub = raw.setdefault("router", {})
        if isinstance(sub, dict):
            sub["indexer"] = [a.strip() for a in env["TOOLSEARCH_INDEXER_ADDRESSES"].split(",") if a.strip()]


def _resolve(base: Path, path: Path) -> Path:
    return path if path.is_absolute() else (base / path).resolve()


def _resolve_tls(base: Path, tls: _TlsModel | None) -> _TlsModel | None:
    """A TLS section with its PEM file paths resolved against the configuration file's folder."""
    if tls is None:
        return None
    paths = {name: _resolve(base, value) for name, value in tls if isinstance(value, Path)}
    return tls.model_copy(update=paths)


def _resolve_ca_file(base: Path, backend: Backend) -> Backend:
    """A backend whose token endpoint's `ca_file`, if any, is resolved against the file's folder."""
    ca_file = backend.auth.ca_file
    if ca_file is None:
        return backend
    auth = backend.auth.model_copy(update={"ca_file": _resolve(base, ca_file.expanduser())})
    return backend.model_copy(update={"auth": auth})


def _resolve_authorization(base: Path, authorization: Authorization | None) -> Authorization | None:
    """The authorization section with its files resolved against the configuration file's folder."""
    if authorization is None:
        return None
    entities = authorization.entities_file
    paths = {
        "policies": _resolve(base, authorization.policies.expanduser()),
        "entities_file": None if entities is None else _resolve(base, entities.expanduser()),
    }
    return authorization.model_copy(update=paths)


def parse_config(raw: object, path: Path, env: Mapping[str, str] | None = None) -> Config:
    """Validate a parsed YAML document; paths resolve against `path`'s folder."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (router, indexer, backends)")
    _apply_env(raw, env or {})
    _add_imported_backends(raw, path)
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, path)) from None
    base = path.parent
    indexer = config.indexer.model_copy(
        update={
            "model": _resolve(base, config.indexer.model),
            "cache_dir": _resolve(base, config.indexer.cache_dir),
            "tls": _resolve_tls(base, config.indexer.tls),
        }
    )
    servers = [s.model_copy(update={"catalog": _resolve(base, s.catalog)}) for s in config.catalog_servers]
    router = config.router.model_copy(update={"indexer_tls": _resolve_tls(base, config.router.indexer_tls)})
    if router.auth.jwks_file is not None:
        keys = _resolve(base, router.auth.jwks_file)
        router = router.model_copy(update={"auth": router.auth.model_copy(update={"jwks_file": keys})})
    backends = [_resolve_ca_file(base, backend) for backend in config.backends]
    authorization = _resolve_authorization(base, config.authorization)
    for index, server in enumerate(servers):
        if not server.register_backends:
            continue
        try:
            slugs = group_by_server(load_catalog(server.catalog))
        except CatalogError as exc:
            raise ConfigError(f"{path}: catalog_servers.{index}.catalog: {exc}") from None
        auth = BackendAuth(type="passthrough")
        for slug in slugs:
            backends.append(
                Backend(
                    id=slug[:64],
                    url=f"http://{server.listen}/servers/{slug}/mcp",
                    auth=auth if slug in server.require_jwt else BackendAuth(),
                    timeout=server.backend_timeout,
                    max_response_bytes=server.backend_max_response_bytes,
                )
            )
    try:
        resolved = Config.model_validate(
            {
                "router": router.model_dump(),
                "indexer": indexer.model_dump(),
                "bridge": config.bridge.model_dump(),
                "backends": [b.model_dump() for b in backends],
                "backends_from": [_resolve(base, file.expanduser()) for file in config.backends_from],
                "catalog_servers": [s.model_dump() for s in servers],
                "authorization": None if authorization is None else authorization.model_dump(),
            }
        )
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, path)) from None
    return _with_bridge_urls(resolved, base)


def _add_imported_backends(raw: dict[str, object], path: Path) -> None:
    """Append the servers of `backends_from` files to `raw`'s backends; a bad entry names its file."""
    files = raw.get("backends_from") or []
    files = [files] if isinstance(files, str) else files
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return  # validation reports the key's type
    backends = raw.get("backends") or []
    if not isinstance(backends, list):
        return
    taken = {b.get("id") for b in backends if isinstance(b, dict)}
    for file in files:
        source = _resolve(path.parent, Path(file).expanduser())
        try:
            servers = read_servers_file(source)
        except ServersFileError as exc:
            raise ConfigError(str(exc)) from None
        for server in servers:
            try:
                Backend.model_validate(server.backend)
            except ValidationError as exc:
                error = exc.errors()[0]
                key = ".".join(str(part) for part in error["loc"])
                message = error["msg"].removeprefix("Value error, ")
                raise ConfigError(f"{source}: {server.where}{'.' + key if key else ''}: {message}") from None
            if server.backend["id"] in taken:
                raise ConfigError(
                    f"{source}: {server.where}: backend id {server.backend['id']!r} is already in use"
                )
            taken.add(server.backend["id"])
            backends.append(server.backend)
    raw["backends"] = backends


def _bridged(backend: Backend, config: Config, base: Path) -> Backend:
    """A backend the bridge serves, as the rest of toolsearch reaches it: at the bridge, over
    Streamable HTTP (a legacy SSE server's endpoint kept in `sse_url`, for the bridge)."""
    if backend.stdio:
        cwd = None if backend.cwd is None else _resolve(base, backend.cwd)
        return backend.model_copy(update={"url": bridge_url(config.bridge, backend.id), "cwd": cwd})
    if backend.transport == "sse":
        url = bridge_url(config.bridge, backend.id)
        return backend.model_copy(update={"url": url, "transport": "streamable_http", "sse_url": backend.url})
    return backend


def _with_bridge_urls(config: Config, base: Path) -> Config:
    """`config` with each stdio backend's cwd resolved, and each backend the bridge serves (stdio,
    legacy SSE) reached at the bridge."""
    if not any(backend.bridged for backend in config.backends):
        return config
    backends = [_bridged(backend, config, base) for backend in config.backends]
    return config.model_copy(update={"backends": backends})


def load_config(path: Path, env: Mapping[str, str] | None = None) -> Config:
    """Read, validate and resolve a configuration file. Entry points pass `os.environ` as `env`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read configuration ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    return parse_config(raw, path, env)
