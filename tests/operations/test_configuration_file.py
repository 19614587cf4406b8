"""The configuration file: validation names the field and the file; env overrides; catalog backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolsearch.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "toolsearch.yaml"
    path.write_text(text)
    return path


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""))
    assert config.router.listen == "127.0.0.1:8000"
    assert config.indexer.search.default_limit == 8
    assert config.indexer.model == (tmp_path / "models/all-MiniLM-L6-v2-tools").resolve()


def test_a_wrong_field_is_named_with_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "indexer:\n  search:\n    default_limit: 500\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "indexer.search.default_limit" in str(info.value)


def test_an_unknown_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"router\.lisen: unknown key"):
        load_config(write(tmp_path, "router:\n  lisen: 1.2.3.4:5\n"))


def test_a_missing_backend_url_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"backends\.0\.url"):
        load_config(write(tmp_path, "backends:\n  - id: weather\n"))


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_yaml_that_does_not_parse_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "router: [unclosed\n"))


def test_environment_overrides_listen_addresses(tmp_path: Path) -> None:
    env = {
        "TOOLSEARCH_ROUTER_LISTEN": "0.0.0.0:9000",
        "TOOLSEARCH_INDEXER_LISTEN": "0.0.0.0:6000",
        "TOOLSEARCH_INDEXER_ADDRESSES": "indexer-1:6000, indexer-2:6000",
    }
    config = load_config(write(tmp_path, "router:\n  listen: 127.0.0.1:1\n"), env)
    assert config.router.listen == "0.0.0.0:9000"
    assert config.indexer.listen == "0.0.0.0:6000"
    assert config.router.indexer == ["indexer-1:6000", "indexer-2:6000"]


def test_the_model_threads_come_from_the_environment_and_zero_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    assert load_config(path).indexer.model_threads is None  # every CPU the indexer may use
    assert load_config(path, {"TOOLSEARCH_INDEXER_MODEL_THREADS": "3"}).indexer.model_threads == 3
    with pytest.raises(ConfigError, match=r"indexer\.model_threads"):
        load_config(path, {"TOOLSEARCH_INDEXER_MODEL_THREADS": "0"})


def test_a_catalog_server_registers_one_backend_per_server(tmp_path: Path) -> None:
    lines = [
        {"server": "Weather Co", "name": "forecast", "description": "d", "inputSchema": {"type": "object"}},
        {"server": "Weather Co", "name": "alerts", "description": "d", "inputSchema": {"type": "object"}},
        {"server": "mail", "name": "send", "description": "d", "inputSchema": {"type": "object"}},
    ]
    (tmp_path / "tools.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    config = load_config(
        write(
            tmp_path,
            "catalog_servers:\n  - catalog: tools.jsonl\n    listen: 127.0.0.1:9100\n"
            "    require_jwt: [mail]\n",
        )
    )
    by_id = {b.id: b for b in config.backends}
    assert set(by_id) == {"Weather_Co", "mail"}
    assert by_id["Weather_Co"].url == "http://127.0.0.1:9100/servers/Weather_Co/mcp"
    assert by_id["mail"].auth.type == "passthrough"


def test_an_indexer_address_may_be_a_dns_target_of_several_replicas(tmp_path: Path) -> None:
    addresses = '["dns:///indexer:50051", "dns://10.0.0.2/indexer-b:50051", "10.0.0.3:50051"]'
    text = f"router:\n  indexer: {addresses}\n"
    assert load_config(write(tmp_path, text)).router.indexer[0] == "dns:///indexer:50051"
    for wrong in ("dns:indexer:50051", "dns:///indexer", "dns:///indexer:port"):
        with pytest.raises(ConfigError, match=r"router\.indexer"):
            load_config(write(tmp_path, f'router:\n  indexer: ["{wrong}"]\n'))


def test_the_health_ports_are_off_unless_configured(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    assert load_config(path).indexer.health_listen is None
    assert load_config(path).router.health_listen is None
    env = {
        "TOOLSEARCH_INDEXER_HEALTH_LISTEN": "0.0.0.0:9464",
        "TOOLSEARCH_ROUTER_HEALTH_LISTEN": "0.0.0.0:8001",
    }
    assert load_config(path, env).indexer.health_listen == "0.0.0.0:9464"
    assert load_config(path, env).router.health_listen == "0.0.0.0:8001"
    with pytest.raises(ConfigError, match=r"indexer\.health_listen"):
        load_config(write(tmp_path, "indexer:\n  health_listen: 9464\n"))


def test_the_routers_health_port_is_fixed_and_apart_from_its_mcp_port(tmp_path: Path) -> None:
    for text, why in (
        ("router:\n  health_listen: 0.0.0.0:0\n", "needs a fixed port"),
        ("router:\n  listen: 0.0.0.0:8000\n  health_listen: 127.0.0.1:8000\n", "a port of its own"),
    ):
        with pytest.raises(ConfigError, match=why):
            load_config(write(tmp_path, text))


def test_the_former_metrics_listen_key_says_what_it_is_called_now(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"metrics_listen is now health_listen"):
        load_config(write(tmp_path, "indexer:\n  metrics_listen: 0.0.0.0:9464\n"))


def test_the_links_certificates_come_from_folders_laid_out_as_tls_secrets(tmp_path: Path) -> None:
    env = {
        "TOOLSEARCH_INDEXER_TLS_DIR": "/etc/toolsearch/tls",
        "TOOLSEARCH_ROUTER_INDEXER_TLS_DIR": "/etc/toolsearch/indexer-tls",
    }
    text = "router:\n  indexer_tls: {ca: a, cert: b, key: c, server_name: indexer}\n"
    config = load_config(write(tmp_path, text), env)
    assert config.indexer.tls is not None and config.router.indexer_tls is not None
    assert str(config.indexer.tls.cert) == "/etc/toolsearch/tls/tls.crt"
    assert str(config.indexer.tls.key) == "/etc/toolsearch/tls/tls.key"
    assert str(config.indexer.tls.client_ca) == "/etc/toolsearch/tls/ca.crt"
    assert str(config.router.indexer_tls.ca) == "/etc/toolsearch/indexer-tls/ca.crt"
    assert str(config.router.indexer_tls.cert) == "/etc/toolsearch/indexer-tls/tls.crt"
    assert config.router.indexer_tls.server_name == "indexer"  # the file's other keys stay


EXCHANGE = (
    "backends:\n  - id: crm\n    url: https://crm.example.com/mcp\n    auth:\n      type: token_exchange\n"
)


def test_a_token_exchange_backend_names_its_endpoint_audience_and_client_variables(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    text = (
        EXCHANGE + "      token_url: https://login.example.com/oauth2/token\n      audience: crm\n"
        "      scopes: [crm.read]\n      client_id_env: CRM_CLIENT_ID\n"
        "      client_secret_env: CRM_CLIENT_SECRET\n      ca_file: certs/ca.pem\n"
    )
    auth = load_config(write(tmp_path, text)).backends[0].auth
    assert (auth.type, auth.audience, auth.scopes) == ("token_exchange", "crm", ["crm.read"])
    assert (auth.client_id_env, auth.client_secret_env) == ("CRM_CLIENT_ID", "CRM_CLIENT_SECRET")
    assert auth.ca_file == (tmp_path / "certs" / "ca.pem").resolve()
    assert (auth.timeout, auth.assumed_lifetime) == (10.0, 60.0)


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ("      audience: crm\n", r"needs token_url, client_id_env, client_secret_env"),
        (
            "      token_url: http://login.example.com/token\n      audience: crm\n"
            "      client_id_env: I\n      client_secret_env: S\n",
            r"token_url must be an https:// URL \(http:// only on 127\.0\.0\.1",
        ),
        (
            "      token_url: https://login.example.com/token\n      audience: crm\n"
            "      client_id_env: I\n      client_secret_env: S\n      timeout: 0\n",
            r"backends\.0\.auth\.timeout",
        ),
    ],
)
def test_a_token_exchange_backend_missing_or_wrong_keys_is_refused_naming_file_and_key(
    tmp_path: Path, auth: str, message: str
) -> None:
    path = write(tmp_path, EXCHANGE + auth)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(path) in str(info.value) and "backends.0.auth" in str(info.value)


def test_exchange_keys_on_another_auth_type_are_refused_so_no_setup_is_silently_ignored(
    tmp_path: Path,
) -> None:
    text = "backends:\n  - id: mail\n    url: https://mail.example.com/mcp\n"
    with pytest.raises(ConfigError, match=r"backends\.0\.auth: token_url, audience: for type token_exchange"):
        load_config(
            write(tmp_path, text + "    auth: {type: passthrough, token_url: 'https://x/t', audience: a}\n")
        )
    with pytest.raises(ConfigError, match=r"backends\.0\.auth: value_env: for type header only"):
        load_config(write(tmp_path, text + "    auth: {type: passthrough, value_env: MAIL_KEY}\n"))


def test_a_plain_http_token_endpoint_is_accepted_on_loopback_only(tmp_path: Path) -> None:
    for url in ("http://127.0.0.1:9000/token", "http://localhost/token", "http://[::1]:9000/token"):
        text = (
            EXCHANGE + f"      token_url: '{url}'\n      audience: crm\n"
            "      client_id_env: I\n      client_secret_env: S\n"
        )
        assert load_config(write(tmp_path, text)).backends[0].auth.token_url == url


def test_a_stdio_backend_may_speak_2026_07_28_shared_only_and_a_url_backend_may_not_say_so(
    tmp_path: Path,
) -> None:
    stdio = "backends:\n  - id: s\n    command: srv\n    protocol: '2026-07-28'\n"
    assert load_config(write(tmp_path, stdio)).backends[0].protocol == "2026-07-28"
    assert load_config(write(tmp_path, "backends:\n  - id: s\n    command: srv\n")).backends[0].protocol == (
        "2025-11-25"
    )
    with pytest.raises(ConfigError, match=r"backends\.0.*no sessions for per_session isolation"):
        load_config(write(tmp_path, stdio + "    isolation: per_session\n"))
    with pytest.raises(ConfigError, match=r"backends\.0.*protocol: for stdio backends \(command\) only"):
        load_config(
            write(tmp_path, "backends:\n  - id: u\n    url: http://h/mcp\n    protocol: '2026-07-28'\n")
        )
    with pytest.raises(ConfigError, match=r"backends\.0\.protocol"):
        load_config(write(tmp_path, "backends:\n  - id: s\n    command: srv\n    protocol: '2099-01-01'\n"))
