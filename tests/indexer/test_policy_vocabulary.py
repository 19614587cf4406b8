"""ToolHive's policies run here unchanged: its vocabulary, its examples, its claims and arguments.

The examples are those of ToolHive's authorization policy reference and its Cedar policies guide
(docs.stacklok.com/toolhive), each asked of the engine as a call would be and as visibility is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from indexer.authorization.authorizer import Authorizer
from indexer.authorization.catalog import Catalog, Item
from indexer.authorization.principal import PolicyPrincipal
from indexer.authorization.verdicts import Verdict
from indexer.authorization.vocabulary import argument_attributes, cedar_value, sanitize_uri
from tests.support.policies import authorizer, compiled
from toolsearch.sections.authorization_settings import Authorization

SETTINGS = Authorization(policies=Path("policies.cedar"))
WEATHER = Item.tool("weather", "forecasts")
OTHER = Item.tool("send_email", "mail")


def caller(authority: Authorizer, subject: str = "user123", **claims: Any) -> PolicyPrincipal:
    return authority.principal(subject, {"sub": subject, **claims})


def test_a_named_tool_is_callable_by_anyone_and_no_other_is() -> None:
    engine = authorizer('permit(principal, action == Action::"call_tool", resource == Tool::"weather");')
    anyone = caller(engine)
    assert engine.decide(anyone, WEATHER).allowed
    assert not engine.decide(anyone, OTHER).allowed


def test_a_named_client_may_call_every_tool() -> None:
    engine = authorizer('permit(principal == Client::"user123", action == Action::"call_tool", resource);')
    assert engine.decide(caller(engine, "user123"), OTHER).allowed
    assert not engine.decide(caller(engine, "someone"), OTHER).allowed


def test_roles_from_the_token_grant_by_claim() -> None:
    engine = authorizer(
        'permit(principal, action == Action::"call_tool", resource) '
        'when { principal.claim_roles.contains("admin") };'
    )
    assert engine.decide(caller(engine, roles=["admin"]), OTHER).allowed
    assert not engine.decide(caller(engine, roles=["viewer"]), OTHER).allowed


def test_claims_and_arguments_together_decide_a_call() -> None:
    engine = authorizer(
        'permit(principal, action == Action::"call_tool", resource == Tool::"sensitive_data") when {\n'
        '  principal.claim_roles.contains("data_analyst") &&\n'
        "  resource.arg_data_level <= principal.claim_clearance_level\n};"
    )
    analyst = caller(engine, roles=["data_analyst"], clearance_level=3)
    tool = Item.tool("sensitive_data", "warehouse")
    assert engine.decide(analyst, tool, {"data_level": 2}).allowed
    assert not engine.decide(analyst, tool, {"data_level": 4}).allowed
    assert engine.visibility(analyst, Catalog([tool])).of(tool).verdict is Verdict.CONDITIONAL


@pytest.mark.parametrize("where", ["principal", "context"])
def test_a_claim_reads_the_same_on_the_principal_and_in_the_context(where: str) -> None:
    engine = authorizer(
        'permit(principal, action == Action::"call_tool", resource == Tool::"weather") '
        f'when {{ {where}.claim_name == "John Doe" }};'
    )
    assert engine.decide(caller(engine, name="John Doe"), WEATHER).allowed
    assert not engine.decide(caller(engine, name="Jane Doe"), WEATHER).allowed


@pytest.mark.parametrize("where", ["resource", "context"])
def test_an_argument_reads_the_same_on_the_resource_and_in_the_context(where: str) -> None:
    engine = authorizer(
        f'permit(principal, action == Action::"call_tool", resource == Tool::"weather") when {{\n'
        f'  {where}.arg_location == "New York" || {where}.arg_location == "London"\n}};'
    )
    anyone = caller(engine)
    assert engine.decide(anyone, WEATHER, {"location": "London"}).allowed
    assert not engine.decide(anyone, WEATHER, {"location": "Paris"}).allowed
    assert not engine.decide(anyone, WEATHER).allowed
    assert engine.visibility(anyone, Catalog([WEATHER, OTHER])).names("tool") == {"weather"}


def test_groups_come_from_the_groups_claim_as_thvgroup_parents() -> None:
    engine = authorizer(
        'permit(principal in THVGroup::"engineering", action == Action::"call_tool", resource);'
    )
    assert engine.decide(caller(engine, groups=["engineering"]), OTHER).allowed
    assert not engine.decide(caller(engine, groups=["sales"]), OTHER).allowed


def test_the_group_claim_is_the_configured_one_then_groups_roles_and_cognito_groups() -> None:
    custom = compiled(
        'permit(principal in THVGroup::"admins", action, resource);',
        group_claim_name="https://example.com/groups",
    )
    assert PolicyPrincipal.of(
        "u", {"https://example.com/groups": ["admins"], "groups": ["x"]}, custom.settings
    ).groups == ("admins",)
    assert PolicyPrincipal.of("u", {"groups": ["x"]}, custom.settings).groups == (
        "x",
    )  # configured claim absent
    assert PolicyPrincipal.of("u", {"roles": ["r"], "cognito:groups": ["c"]}, SETTINGS).groups == ("r",)
    assert PolicyPrincipal.of("u", {"cognito:groups": ["c"]}, SETTINGS).groups == ("c",)
    assert PolicyPrincipal.of("u", {"groups": "not-a-list", "roles": ["r"]}, SETTINGS).groups == ("r",)


def test_a_dotted_group_claim_reads_a_nested_one_and_roles_add_to_groups() -> None:
    settings = Authorization(
        policies=Path("p"), group_claim_name="realm_access.roles", role_claim_name="app_roles"
    )
    claims = {"realm_access": {"roles": ["editor", "viewer"]}, "app_roles": ["viewer", "billing"]}
    assert PolicyPrincipal.of("u", claims, settings).groups == ("editor", "viewer", "billing")


def test_a_resource_read_is_granted_to_a_group_and_named_by_its_sanitized_uri() -> None:
    engine = authorizer(
        'permit(principal in THVGroup::"platform", action == Action::"read_resource", resource);\n'
        'permit(principal, action == Action::"read_resource", resource) '
        'when { resource.uri == "file:///data/config.json" };'
    )
    config = Item.resource("file:///data/config.json", "files")
    other = Item.resource("file:///data/other.json", "files")
    assert config.uid == ("Resource", "file____data_config_json") == ("Resource", sanitize_uri(config.name))
    anyone = caller(engine)
    assert engine.decide(anyone, config).allowed
    assert not engine.decide(anyone, other).allowed
    assert engine.decide(caller(engine, groups=["platform"]), other).allowed


def test_annotations_are_read_with_has_and_an_unguarded_read_of_a_missing_one_does_not_apply() -> None:
    guarded = authorizer(
        'permit(principal, action == Action::"call_tool", resource) '
        "when { resource has readOnlyHint && resource.readOnlyHint == true };"
    )
    unguarded = authorizer(
        'permit(principal, action == Action::"call_tool", resource) when { resource.readOnlyHint == true };'
    )
    reader = Item.tool("list", "files", {"readOnlyHint": True})
    unknown = Item.tool("write", "files", {"title": "Write", "readOnlyHint": "yes"})  # not a boolean: not set
    for engine in (guarded, unguarded):
        assert engine.decide(caller(engine), reader).allowed
        decision = engine.decide(caller(engine), unknown)
        assert not decision.allowed
    assert unguarded.decide(caller(unguarded), unknown).errors  # the missing attribute, said


def test_a_server_scoped_policy_reaches_the_tools_prompts_and_resources_of_its_backend() -> None:
    engine = authorizer('permit(principal, action, resource in MCP::"github");')
    catalog = Catalog(
        [
            Item.tool("create_issue", "github"),
            Item.prompt("triage", "github"),
            Item.resource("gh://repo", "github"),
            OTHER,
        ]
    )
    seen = engine.visibility(caller(engine), catalog)
    assert [item.name for item in seen.visible] == ["create_issue", "triage", "gh://repo"]


def test_each_resource_knows_its_backend_which_toolhive_lacks() -> None:
    engine = authorizer(
        'permit(principal, action == Action::"call_tool", resource) when { resource.backend == "mail" };'
    )
    assert engine.decide(caller(engine), OTHER).allowed
    assert not engine.decide(caller(engine), WEATHER).allowed


def test_custom_entities_in_toolhives_form_give_tools_attributes(tmp_path: Path) -> None:
    entities = [
        {"uid": "Tool::weather", "attrs": {"owner": "user123", "department": "engineering"}},
        {"uid": 'Tool::"billing"', "attrs": {"owner": "finance-bot", "department": "finance"}},
    ]
    policy = compiled(
        'permit(principal, action == Action::"call_tool", resource) '
        "when { resource.owner == principal.claim_sub };",
        entities=entities,
        tmp=tmp_path,
    )
    engine = Authorizer(policy)
    assert engine.decide(caller(engine, "user123"), WEATHER).allowed
    assert not engine.decide(caller(engine, "user123"), Item.tool("billing", "finance")).allowed
    assert engine.visibility(
        caller(engine, "finance-bot"), Catalog([WEATHER, Item.tool("billing", "f")])
    ).names("tool") == {"billing"}


def test_the_entities_file_gives_groups_parents_of_their_own(tmp_path: Path) -> None:
    entities = [
        {"uid": {"type": "THVGroup", "id": "sre"}, "parents": [{"type": "THVGroup", "id": "engineering"}]}
    ]
    policy = compiled(
        'permit(principal in THVGroup::"engineering", action, resource);', entities=entities, tmp=tmp_path
    )
    engine = Authorizer(policy)
    assert engine.decide(caller(engine, groups=["sre"]), OTHER).allowed
    assert (
        engine.visibility(caller(engine, groups=["sre"]), Catalog([OTHER])).of(OTHER).verdict
        is Verdict.ALLOWED
    )


@pytest.mark.parametrize("scopes", ["mcp:tools read", ["mcp:tools", "read"]])
def test_a_multi_valued_claim_is_a_set_and_a_string_whatever_shape_the_token_gives(scopes: Any) -> None:
    policy = compiled(
        'permit(principal, action == Action::"call_tool", resource) '
        'when { principal.claimset_scope.contains("mcp:tools") };\n'
        'permit(principal, action == Action::"get_prompt", resource) '
        'when { principal.claim_scope like "*read*" };',
        multi_valued_claims=["scope"],
    )
    engine = Authorizer(policy)
    holder = caller(engine, scope=scopes)
    assert holder.attributes["claim_scope"] == "mcp:tools read"
    assert engine.decide(holder, OTHER).allowed
    assert engine.decide(holder, Item.prompt("p", "b")).allowed
    assert not engine.decide(caller(engine, scope="read"), OTHER).allowed


def test_claims_become_cedar_values_as_toolhive_converts_them() -> None:
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(12):
        deep = {"next": deep}
    claims = {
        "n": 3,
        "f": 0.12345,
        "ok": True,
        "tags": ["a", 1, None],
        "act": {"sub": "svc"},
        "nothing": None,
        "deep": deep,
    }
    attributes = PolicyPrincipal.of("u", claims, SETTINGS).attributes
    assert attributes["claim_n"] == 3
    assert attributes["claim_f"] == {"__extn": {"fn": "decimal", "arg": "0.1234"}}  # four places, cut
    assert attributes["claim_tags"] == ["a", 1]
    assert attributes["claim_act"] == {"sub": "svc"}
    assert "claim_nothing" not in attributes
    depth, level = 0, attributes["claim_deep"]
    while "next" in level:
        depth, level = depth + 1, level["next"]
    assert depth == 10 and level == {}  # below ten levels, nothing
    assert cedar_value(2**63) is None and cedar_value(float("nan")) is None


def test_a_claim_cannot_forge_an_entity_or_an_extension_value() -> None:
    engine = authorizer(
        'permit(principal, action, resource) when { principal.claim_x == THVGroup::"admins" };'
    )
    forger = caller(engine, x={"__entity": {"type": "THVGroup", "id": "admins"}})
    assert forger.attributes["claim_x"] == {}
    assert not engine.decide(forger, OTHER).allowed


def test_a_nested_claim_is_read_with_dots() -> None:
    engine = authorizer('permit(principal, action, resource) when { context.claim_act.sub == "agent-7" };')
    assert engine.decide(caller(engine, act={"sub": "agent-7"}), OTHER).allowed


def test_arguments_become_attributes_as_toolhive_converts_them() -> None:
    converted = argument_attributes(
        {"s": "x", "n": 10, "f": 0.5, "b": False, "o": {"k": 1}, "a": [1], "z": None}
    )
    assert converted == {
        "arg_s": "x",
        "arg_n": 10,
        "arg_f": {"__extn": {"fn": "decimal", "arg": "0.5000"}},
        "arg_b": False,
        "arg_o_present": True,
        "arg_a_present": True,
        "arg_z_present": True,
    }


def test_the_anonymous_caller_is_a_client_a_policy_may_name_and_has_no_claims() -> None:
    engine = authorizer(
        'permit(principal == Client::"anonymous", action == Action::"call_tool", '
        'resource == Tool::"weather");\n'
        'permit(principal, action == Action::"call_tool", resource == Tool::"send_email") '
        "when { principal has claim_sub };"
    )
    anonymous = PolicyPrincipal.anonymous()
    assert engine.decide(anonymous, WEATHER).allowed
    assert not engine.decide(anonymous, OTHER).allowed
    assert engine.decide(caller(engine), OTHER).allowed
    assert engine.visibility(anonymous, Catalog([WEATHER, OTHER])).names("tool") == {"weather"}


def test_prompts_are_asked_with_get_prompt_and_their_arguments() -> None:
    engine = authorizer(
        'permit(principal, action == Action::"get_prompt", resource == Prompt::"greeting") '
        'when { resource.arg_tone == "warm" };'
    )
    greeting = Item.prompt("greeting", "prompts")
    assert engine.decide(caller(engine), greeting, {"tone": "warm"}).allowed
    assert not engine.decide(caller(engine), greeting, {"tone": "cold"}).allowed
    assert not engine.decide(caller(engine), Item.tool("greeting", "prompts"), {"tone": "warm"}).allowed
