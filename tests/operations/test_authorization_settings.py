"""The `authorization` section: its keys, its paths, and the one line `up` and `indexer` refuse a
policy file with before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from commands import indexer, up
from commands.authorization import policy_checked, policy_problem
from toolsearch.config import ConfigError, load_config

LISTEN = "router:\n  listen: 127.0.0.1:0\nindexer:\n  listen: 127.0.0.1:0\n"
GOOD = 'permit(principal, action == Action::"call_tool", resource in MCP::"github");\n'
BAD = 'permit(principal, action == Action::"call_tool", resource)\n  when { resource.readonly };\n'


def configured(tmp_path: Path, section: str, policy: str | None = GOOD) -> Path:
    folder = tmp_path / "conf"
    folder.mkdir(exist_ok=True)
    if policy is not None:
        (folder / "policies.cedar").write_text(policy, encoding="utf-8")
    path = folder / "toolsearch.yaml"
    path.write_text(LISTEN + section, encoding="utf-8")
    return path


def test_without_the_section_there_is_no_policy_to_check(tmp_path: Path) -> None:
    config = load_config(configured(tmp_path, "", policy=None))
    assert config.authorization is None and policy_problem(config) is None


def test_the_files_resolve_against_the_configuration_files_folder(tmp_path: Path) -> None:
    section = "authorization:\n  policies: policies.cedar\n  entities_file: ../entities.json\n"
    settings = load_config(configured(tmp_path, section)).authorization
    assert settings is not None
    assert settings.policies == tmp_path / "conf" / "policies.cedar"
    assert settings.entities_file == tmp_path / "entities.json"
    assert settings.reload_interval == 5.0 and settings.multi_valued_claims == []


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("authorization:\n  policy: p.cedar\n", "authorization.policy: unknown key"),
        ("authorization:\n  group_claim_name: groups\n", "authorization.policies: Field required"),
        ("authorization:\n  policies: p.cedar\n  reload_interval: 0\n", "authorization.reload_interval"),
        ("authorization:\n  policies: p.cedar\n  reload_interval: 600\n", "authorization.reload_interval"),
        ("authorization:\n  policies: p.cedar\n  role_claim_name: ''\n", "authorization.role_claim_name"),
        (
            "authorization:\n  policies: p.cedar\n  multi_valued_claims: [' scp']\n",
            "authorization.multi_valued_claims",
        ),
    ],
)
def test_a_wrong_key_or_value_is_named(tmp_path: Path, section: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(configured(tmp_path, section))


def test_up_refuses_a_bad_policy_file_in_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = configured(tmp_path, "authorization:\n  policies: policies.cedar\n", BAD)
    assert up.run(load_config(path), path) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f'toolsearch up: {path.parent / "policies.cedar"}:2:19: unknown attribute "readonly" of resource '
        "(did you mean readOnlyHint?): resources have backend, destructiveHint, feature, idempotentHint, "
        "name, openWorldHint, operation, readOnlyHint, uri and arg_<argument>"
    ]


def test_the_indexer_refuses_a_bad_policy_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = configured(
        tmp_path, "authorization:\n  policies: policies.cedar\n", "permit(principal, action, resource)"
    )
    args = argparse.Namespace(config=str(path), log_level="info", log_format="text")
    assert indexer.run(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"indexer: {path.parent / 'policies.cedar'}:1:36: unexpected end of input"]


def test_a_good_policy_starts_and_the_banner_says_it_is_in_force(tmp_path: Path) -> None:
    config = load_config(configured(tmp_path, "authorization:\n  policies: policies.cedar\n"))
    problem, banner = policy_checked(config)
    assert problem is None
    assert "policies.cedar in force (1 policy)" in banner and "denied" in banner
    assert policy_checked(load_config(configured(tmp_path, "")))[1].startswith("authorization: none")
