"""A policy file is refused in one line naming the file, line and column; a good one is labelled and
fingerprinted by what decides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indexer.authorization.entities import read_entities
from indexer.authorization.source import PolicyError
from tests.support.policies import compiled, loaded, written

GOOD = 'permit(principal, action == Action::"call_tool", resource);\n'


def refusal(text: str, **options: object) -> str:
    with pytest.raises(PolicyError) as refused:
        compiled(text, **options)
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD + "permit(principal, action, resource)\nwhen { resource.name == };\n",
            "policies.cedar:3:26: unexpected token",
        ),
        (GOOD + "permit(principal, action, resource)", "policies.cedar:2:36: unexpected end of input"),
        (GOOD + "  permit(principal, acton, resource);", "policies.cedar:2:21: found an invalid variable"),
        (
            "permit(principal, action, resource) when {\n  foo(1) };",
            "policies.cedar:2:3: `foo` is not a valid function",
        ),
        ('permit(principal, action, resource) when { "abc };', "policies.cedar:1:44: invalid token"),
        ("permit(principal, action, resource) when { principal.claim_x = 1 };", "policies.cedar:1:62: '='"),
        ("permitt(principal, action, resource);", "policies.cedar:1:1: invalid policy effect"),
    ],
)
def test_a_file_cedar_cannot_parse_is_refused_at_its_line_and_column(text: str, expected: str) -> None:
    assert refusal(text).startswith(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "permit(principal, action, resource) when {\n  resource has readonlyHint };",
            'policies.cedar:2:16: unknown attribute "readonlyHint" of resource (did you mean readOnlyHint?)',
        ),
        (
            'permit(principal, action, resource) when { principal.email == "a@b" };',
            'policies.cedar:1:54: unknown attribute "email" of principal',
        ),
        (
            "permit(principal, action, resource) when { context.current_hour >= 9 };",
            'policies.cedar:1:52: unknown attribute "current_hour" of context',
        ),
        (
            'permit(principal, action == Action::"list_tools", resource);',
            'policies.cedar:1:29: unknown action Action::"list_tools": lists show what',
        ),
        (
            'permit(principal, action in [Action::"call_tool", Action::"call_tol"], resource);',
            'policies.cedar:1:51: unknown action Action::"call_tol": the actions are call_tool, '
            "get_prompt and read_resource (did you mean call_tool?)",
        ),
        (
            'permit(principal in Group::"x", action, resource);',
            "policies.cedar:1:21: unknown entity type Group",
        ),
        (
            "permit(principal, action, resource) when { resource is Tol };",
            "policies.cedar:1:56: unknown entity type Tol",
        ),
        (
            "permit(principal == ?principal, action, resource);",
            "policies.cedar:1:21: ?principal makes this a template",
        ),
        (
            "permit(principal, action, resource) when { context == {} };",
            "policies.cedar:1:44: context is read by",
        ),
        (
            'permit(principal, action, resource) when { principal.claimset_scope.contains("x") };',
            'policies.cedar:1:54: unknown attribute "claimset_scope" of principal: claimset_<claim> exists',
        ),
        (
            'permit(principal, action, resource) when { Tool::"x".arg_limit > 1 };',
            'policies.cedar:1:54: unknown attribute "arg_limit" of Tool::"x"',
        ),
    ],
)
def test_a_name_the_vocabulary_lacks_is_refused_where_it_is_written(text: str, expected: str) -> None:
    assert refusal(text).startswith(expected)


def test_a_claim_set_of_a_configured_multi_valued_claim_is_a_name_that_exists() -> None:
    compiled(
        'permit(principal, action, resource) when { principal.claimset_scope.contains("x") };',
        multi_valued_claims=["scope"],
    )


def test_the_entities_file_adds_its_types_and_attributes_to_the_vocabulary(tmp_path: Path) -> None:
    entities = [{"uid": {"type": "Team", "id": "red"}, "attrs": {"lead": "ann"}}]
    text = 'permit(principal, action, resource) when { Team::"red".lead == principal.claim_sub };'
    compiled(text, entities=entities, tmp=tmp_path)
    assert refusal(text).startswith("policies.cedar:1:44: unknown entity type Team")


def test_an_empty_file_is_a_policy_that_permits_nothing() -> None:
    assert compiled("// nothing yet\n").rules == ()


def test_each_policy_is_labelled_by_its_id_or_its_line() -> None:
    text = (
        '@id("readers")\npermit(principal, action, resource);\n\n// comment\n'
        + "forbid(principal, action, resource);"
    )
    policy = compiled(text)
    assert [rule.label for rule in policy.rules] == ["readers", "policies.cedar:5"]


def test_comments_and_spacing_keep_the_fingerprint_and_a_rule_changes_it() -> None:
    base = compiled('@id("a") permit(principal, action, resource);')
    assert (
        compiled('// who may do what\n@id("a")   permit( principal, action, resource );').fingerprint
        == base.fingerprint
    )
    assert compiled('@id("a") forbid(principal, action, resource);').fingerprint != base.fingerprint
    assert (
        compiled('@id("a") permit(principal, action, resource);', group_claim_name="g").fingerprint
        != base.fingerprint
    )


def test_the_files_are_read_from_the_configured_paths(tmp_path: Path) -> None:
    policy = loaded(tmp_path, GOOD)
    assert policy.path == tmp_path / "policies.cedar" and len(policy.rules) == 1
    with pytest.raises(PolicyError, match=r"policies\.cedar:1:1: invalid policy effect"):
        loaded(tmp_path, "permitt(principal, action, resource);")


def test_a_missing_policy_file_is_refused_naming_it(tmp_path: Path) -> None:
    settings = written(tmp_path, GOOD)
    settings.policies.unlink()
    from indexer.authorization.policies import load_policy

    with pytest.raises(PolicyError, match=r"policies\.cedar: cannot read the policy file"):
        load_policy(settings)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[{", "entities.json:1:3: not a JSON array of Cedar entities"),
        ('{"uid": "Tool::x"}', "entities.json: must be a JSON array"),
        ('[{"attrs": {}}]', 'entities.json: entity 0: needs a "uid"'),
        ('[{"uid": "Action::\\"call_tool\\""}]', "entities.json: entity 0: actions are call_tool"),
        (
            '[{"uid": "Tool::x"}, {"uid": {"type": "Tool", "id": "x"}}]',
            'entities.json: entity 1: Tool::"x" is given twice',
        ),
        ('[{"uid": "Tool::x", "attrs": {"n": 1.5}}]', "entities.json: Cedar refuses these entities"),
    ],
)
def test_a_bad_entities_file_is_refused_naming_it_and_the_entity(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "entities.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(PolicyError) as refused:
        read_entities(path)
    assert str(refused.value).removeprefix(f"{tmp_path}/").startswith(expected)


def test_the_entities_file_accepts_toolhives_string_uids_and_leaves_out_nothing(tmp_path: Path) -> None:
    path = tmp_path / "entities.json"
    path.write_text(
        json.dumps([{"uid": "Tool::weather", "attrs": {"owner": "u"}, "parents": ['MCP::"forecasts"']}])
    )
    entities = read_entities(path)
    assert entities.by_uid[("Tool", "weather")] == {
        "attrs": {"owner": "u"},
        "parents": [{"type": "MCP", "id": "forecasts"}],
    }
