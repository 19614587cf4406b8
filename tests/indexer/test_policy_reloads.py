"""Policy reloads: a good change of the files goes in force and is announced; a bad one is logged in
one line and the last good policy stays; a ConfigMap's symlink swap is seen like any write."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from indexer.authorization.authorizer import Authorizer
from indexer.authorization.catalog import Catalog, Item
from indexer.authorization.policies import load_policy
from indexer.upkeep.policy_reload import PolicyWatcher
from tests.support.policies import written
from tests.support.waits import wait_for
from toolsearch.sections.authorization_settings import Authorization

GRANT = '@id("grant") permit(principal, action == Action::"call_tool", resource == Tool::"query");\n'
REVOKE = "// nothing is granted any more\n"
QUERY = Item.tool("query", "db")
LOGGER = "indexer.upkeep.policy_reload"


class Announced(list[str]):
    """The reasons the watcher announced, as the Rebuilder would receive them."""


def watching(settings: Authorization, interval: float = 0.05) -> tuple[Authorizer, PolicyWatcher, Announced]:
    authorizer = Authorizer(load_policy(settings))
    announced = Announced()
    return authorizer, PolicyWatcher(settings, authorizer, announced.append, interval), announced


def visible(authorizer: Authorizer) -> set[str]:
    return set(authorizer.visibility(authorizer.principal("u", {}), Catalog([QUERY])).names("tool"))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


async def test_a_good_change_goes_in_force_and_is_announced_once(tmp_path: Path) -> None:
    settings = written(tmp_path, GRANT)
    authorizer, watcher, announced = watching(settings)
    assert not await watcher.check()  # the files as they were loaded: nothing new
    assert visible(authorizer) == {"query"}
    settings.policies.write_text(REVOKE)
    assert await watcher.check()
    assert visible(authorizer) == set()
    assert announced == [f"authorization policy {authorizer.policy.fingerprint[:12]}"]
    assert not await watcher.check()
    assert len(announced) == 1


async def test_a_change_of_comments_alone_is_read_and_announces_nothing(tmp_path: Path) -> None:
    settings = written(tmp_path, GRANT)
    authorizer, watcher, announced = watching(settings)
    settings.policies.write_text(GRANT + "// who may query\n")
    assert not await watcher.check()
    assert announced == [] and visible(authorizer) == {"query"}


async def test_a_bad_file_keeps_the_last_good_policy_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = written(tmp_path, GRANT)
    authorizer, watcher, announced = watching(settings)
    good = authorizer.policy.fingerprint
    settings.policies.write_text(
        GRANT + 'permit(principal, action == Action::"call_tool", resource) when { resource.readonly };'
    )
    caplog.set_level(logging.WARNING, LOGGER)
    assert not await watcher.check()
    assert not await watcher.check()
    assert authorizer.policy.fingerprint == good and visible(authorizer) == {"query"}
    assert announced == []
    [line] = warnings(caplog)
    assert f'{settings.policies}:2:76: unknown attribute "readonly"' in line and good[:12] in line
    settings.policies.write_text(REVOKE)
    assert await watcher.check()
    assert visible(authorizer) == set()


async def test_a_file_gone_keeps_the_last_good_policy_until_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = written(tmp_path, GRANT)
    authorizer, watcher, announced = watching(settings)
    caplog.set_level(logging.WARNING, LOGGER)
    settings.policies.unlink()
    assert not await watcher.check()
    assert visible(authorizer) == {"query"}
    assert "cannot read the policy file" in warnings(caplog)[0]
    settings.policies.write_text(REVOKE)
    assert await watcher.check()
    assert visible(authorizer) == set() and len(announced) == 1


async def test_a_configmap_update_swapping_a_symlink_is_seen(tmp_path: Path) -> None:
    # as the kubelet updates a ConfigMap volume: a new timestamped folder, `..data` pointed at it
    first, second = tmp_path / "..2024_01_01", tmp_path / "..2024_01_02"
    first.mkdir()
    second.mkdir()
    (first / "policies.cedar").write_text(GRANT)
    (second / "policies.cedar").write_text(REVOKE)
    (tmp_path / "..data").symlink_to(first.name)
    (tmp_path / "policies.cedar").symlink_to("..data/policies.cedar")
    settings = Authorization(policies=tmp_path / "policies.cedar")
    authorizer, watcher, _ = watching(settings)
    assert visible(authorizer) == {"query"}
    (tmp_path / "..data_tmp").symlink_to(second.name)
    (tmp_path / "..data_tmp").replace(tmp_path / "..data")
    assert await watcher.check()
    assert visible(authorizer) == set()


async def test_a_change_of_the_entities_file_is_a_change_of_the_policy(tmp_path: Path) -> None:
    entities = tmp_path / "entities.json"
    entities.write_text(json.dumps([{"uid": "Tool::query", "attrs": {"owner": "u"}}]))
    text = "permit(principal, action, resource) when { resource.owner == principal.claim_sub };"
    settings = written(tmp_path, text, entities_file=entities)
    authorizer, watcher, announced = watching(settings)
    owner = authorizer.principal("u", {"sub": "u"})
    assert authorizer.decide(owner, QUERY).allowed
    entities.write_text(json.dumps([{"uid": "Tool::query", "attrs": {"owner": "someone else"}}]))
    assert await watcher.check()
    assert not authorizer.decide(owner, QUERY).allowed and len(announced) == 1


async def test_the_polls_pick_a_change_up_within_their_interval(tmp_path: Path) -> None:
    settings = written(tmp_path, GRANT)
    authorizer, watcher, announced = watching(settings, interval=0.05)
    watcher.start()
    try:
        settings.policies.write_text(REVOKE)
        await wait_for(lambda: bool(announced))
        assert visible(authorizer) == set() and watcher.reloads == 1
    finally:
        await watcher.close()
