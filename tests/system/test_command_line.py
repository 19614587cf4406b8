"""The `toolsearch` command's manners: a version, a list of commands, an example in every help."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from commands.cli import _COMMANDS, build_parser
from commands.ports import free_port
from commands.up import LogSettings
from tests.support.catalogs import small_catalog
from tests.support.processes import start_process
from tests.support.stack import CLI, MODEL, START_TIMEOUT, open_session

ROOT = Path(__file__).resolve().parents[2]


def toolsearch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT)


def commands_of(
    parser: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command and sub-command under `parser`, as (path after `toolsearch`, its parser)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                sub_path = f"{path} {name}".strip()
                yield sub_path, sub
                yield from commands_of(sub, sub_path)


def examples_of(parser: argparse.ArgumentParser) -> str:
    """What follows the `example:` or `examples:` heading of a help text, or fails."""
    heading = re.search(r"^examples?:$", parser.format_help(), re.MULTILINE)
    assert heading is not None, parser.prog
    return parser.format_help()[heading.end() :]


def test_version_prints_the_packages_version_and_exits_0() -> None:
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = toolsearch("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"toolsearch {expected}"


def test_bare_toolsearch_lists_every_command_and_exits_2() -> None:
    result = toolsearch()
    assert result.returncode == 2
    assert result.stdout == ""
    listed = result.stderr
    for names in _COMMANDS.values():
        for name in names:
            assert f"\n    {name}" in listed, name
    assert "usage: toolsearch" in listed and "--version" in listed


def test_every_commands_help_ends_with_an_example_of_that_command() -> None:
    found = list(commands_of(build_parser()))
    assert len(found) >= len(_COMMANDS) + 5  # model prepare|verify|recipe, health grpc|http
    for path, parser in found:
        example = examples_of(parser)
        assert f"toolsearch {path}" in example, (path, example)


@pytest.mark.parametrize("path", ["up", "router", "health grpc"])
def test_an_example_keeps_its_line_breaks(path: str) -> None:
    parser = dict(commands_of(build_parser()))[path]
    lines = examples_of(parser).splitlines()
    assert all(
        line.startswith("  toolsearch ") or line.startswith("  python -m ") for line in lines[1:] if line
    )


def test_up_takes_the_log_options_and_hands_them_to_its_parts() -> None:
    args = build_parser("up").parse_args(
        ["up", "--config", "f.yaml", "--log-level", "debug", "--log-format", "json"]
    )
    logs = LogSettings(args.log_level, args.log_format)
    assert logs.args() == ["--log-level", "debug", "--log-format", "json"]
    assert logs.catalog_args() == ["--log-level", "debug"]
    # every part's own parser accepts what up hands it
    for part in ("indexer", "router", "bridge"):
        parsed = build_parser(part).parse_args([part, "--config", "f.yaml", *logs.args()])
        assert (parsed.log_level, parsed.log_format) == ("debug", "json")
    catalog = build_parser("catalog-server").parse_args(
        ["catalog-server", "--catalog", "c.jsonl", *LogSettings().catalog_args()]
    )
    assert catalog.log_level == "warning"  # uvicorn would log each of its requests from info on


def test_up_refuses_a_log_level_its_parts_do_not_know() -> None:
    result = toolsearch("up", "--config", "examples/demo.yaml", "--log-level", "chatty")
    assert result.returncode == 2
    assert "invalid choice: 'chatty'" in result.stderr


def test_up_runs_its_parts_with_the_log_format_and_level_it_was_given(tmp_path: Path) -> None:
    small_catalog(tmp_path / "catalog.jsonl")
    indexer, router = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    config = {
        "router": {"listen": router, "indexer": [indexer]},
        "indexer": {"listen": indexer, "model": str(MODEL), "cache_dir": str(tmp_path / "cache")},
        "catalog_servers": [
            {"catalog": str(tmp_path / "catalog.jsonl"), "listen": f"127.0.0.1:{free_port()}"}
        ],
    }
    path = tmp_path / "toolsearch.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [*CLI, "up", "--config", str(path), "--log-format", "json", "--log-level", "info"]
    with start_process(args, f"http://{router}/readyz", timeout=START_TIMEOUT) as up:
        open_session(f"http://{router}/mcp")
        deadline = time.monotonic() + 30
        while '"router.access_log"' not in up.output():
            assert time.monotonic() < deadline, up.output()
            time.sleep(0.05)
        output = up.stop()
    entries = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    loggers = {entry["logger"].split(".")[0] for entry in entries}
    assert {"indexer", "router"} <= loggers, output
    access = next(entry for entry in entries if entry["logger"] == "router.access_log")
    assert access["method"] == "initialize" and access["outcome"] == "ok"
    assert not any(entry["level"] == "debug" for entry in entries), [
        e for e in entries if e["level"] == "debug"
    ]
    assert "HTTP Request:" not in output  # the indexer listed its backends over HTTP, quietly
