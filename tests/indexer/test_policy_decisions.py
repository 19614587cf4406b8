"""What the engine answers: default deny, forbids that override, arguments decided at call time, and
visibility's verdicts with the policies behind them, kept for the callers a policy cannot tell apart."""

from __future__ import annotations

from pathlib import Path

from indexer.authorization.authorizer import Authorizer
from indexer.authorization.catalog import Catalog, Item
from indexer.authorization.verdicts import NO_PERMIT, Seen, Verdict
from tests.support.policies import authorizer, compiled

READ = Item.tool("list_issues", "github", {"readOnlyHint": True})
WRITE = Item.tool("create_issue", "github", {"readOnlyHint": False})
DROP = Item.tool("drop_table", "db", {"destructiveHint": True})
QUERY = Item.tool("query", "db", {"readOnlyHint": True, "destructiveHint": False})
CATALOG = Catalog([READ, WRITE, DROP, QUERY])
CALL = 'action == Action::"call_tool"'


def test_what_no_policy_permits_is_denied() -> None:
    engine = authorizer(f'@id("readers") permit(principal, {CALL}, resource == Tool::"list_issues");')
    anyone = engine.principal("u", {})
    assert engine.decide(anyone, READ).allowed and engine.decide(anyone, READ).policies == ("readers",)
    denied = engine.decide(anyone, WRITE)
    assert not denied.allowed and denied.policies == () and denied.reason == NO_PERMIT
    assert engine.visibility(anyone, CATALOG).of(WRITE) == Seen(Verdict.DENIED)


def test_an_empty_policy_denies_everything() -> None:
    engine = authorizer("")
    assert engine.visibility(engine.principal("u", {}), CATALOG).visible == ()


def test_a_forbid_overrides_every_permit_and_is_named() -> None:
    engine = authorizer(
        f'@id("all") permit(principal, {CALL}, resource);\n'
        f'@id("no-destroy") forbid(principal, {CALL}, resource) when {{ resource has destructiveHint && '
        'resource.destructiveHint } unless { principal in THVGroup::"dba" };'
    )
    anyone, dba = engine.principal("u", {}), engine.principal("d", {"groups": ["dba"]})
    decision = engine.decide(anyone, DROP)
    assert not decision.allowed and decision.reason == "forbidden by no-destroy"
    assert engine.visibility(anyone, CATALOG).of(DROP) == Seen(Verdict.DENIED, ("no-destroy",))
    assert engine.visibility(anyone, CATALOG).of(QUERY) == Seen(Verdict.ALLOWED, ("all",))
    assert engine.decide(dba, DROP).allowed
    assert engine.visibility(dba, CATALOG).of(DROP).verdict is Verdict.ALLOWED


def test_read_only_tools_for_a_group() -> None:
    engine = authorizer(
        f'permit(principal in THVGroup::"auditors", {CALL}, resource) '
        "when { resource has readOnlyHint && resource.readOnlyHint };"
    )
    auditor = engine.principal("a", {"groups": ["auditors"]})
    assert engine.visibility(auditor, CATALOG).names("tool") == {"list_issues", "query"}
    assert engine.visibility(engine.principal("b", {}), CATALOG).names("tool") == set()


def test_a_permit_on_arguments_leaves_the_tool_visible_and_the_call_decides() -> None:
    engine = authorizer(
        f'@id("own-customer") permit(principal, {CALL}, resource == Tool::"query") '
        "when { context.arg_customer == principal.claim_customer };"
    )
    agent = engine.principal("s", {"customer": "acme"})
    assert engine.visibility(agent, CATALOG).of(QUERY) == Seen(Verdict.CONDITIONAL, ("own-customer",))
    assert engine.decide(agent, QUERY, {"customer": "acme"}).allowed
    assert not engine.decide(agent, QUERY, {"customer": "globex"}).allowed
    assert not engine.decide(agent, QUERY).allowed


def test_a_forbid_on_arguments_does_not_hide_a_permitted_tool() -> None:
    engine = authorizer(
        f'@id("db") permit(principal, {CALL}, resource in MCP::"db");\n'
        f'@id("limit") forbid(principal, {CALL}, resource) '
        "when { context has arg_limit && context.arg_limit > 100 };"
    )
    anyone = engine.principal("u", {})
    assert engine.visibility(anyone, CATALOG).of(QUERY) == Seen(Verdict.CONDITIONAL, ("limit",))
    assert engine.visibility(anyone, CATALOG).of(READ) == Seen(Verdict.DENIED)
    assert engine.decide(anyone, QUERY, {"limit": 10}).allowed
    refused = engine.decide(anyone, QUERY, {"limit": 1000})
    assert not refused.allowed and refused.policies == ("limit",)


def test_a_policy_that_fails_to_evaluate_does_not_apply_and_says_why() -> None:
    engine = authorizer(
        f'@id("hinted") permit(principal, {CALL}, resource) when {{ resource.readOnlyHint }};\n'
        f'@id("guard") forbid(principal, {CALL}, resource) when {{ principal.claim_level < 3 }};'
    )
    decision = engine.decide(engine.principal("u", {}), DROP)
    assert not decision.allowed
    assert any("`hinted`" in error for error in decision.errors)
    assert any("`guard`" in error for error in decision.errors)
    assert engine.decide(engine.principal("u", {}), READ).allowed  # the forbid errs: it does not apply


def test_an_answer_is_kept_for_a_refreshed_token_and_asked_again_for_a_claim_that_counts() -> None:
    engine = authorizer(
        f'permit(principal, {CALL}, resource in MCP::"db") when {{ principal.claim_team == "data" }};'
    )
    first = engine.visibility(engine.principal("u", {"team": "data", "exp": 100}), CATALOG)
    assert engine.visibility(engine.principal("u", {"team": "data", "exp": 200}), CATALOG) is first
    assert (
        engine.visibility(engine.principal("v", {"team": "data", "exp": 300}), CATALOG) is first
    )  # not named
    assert engine.visibility(engine.principal("u", {"team": "web"}), CATALOG).visible == ()


def test_a_new_policy_replaces_the_answers_and_an_equal_one_changes_nothing(tmp_path: Path) -> None:
    engine = authorizer(f'permit(principal, {CALL}, resource == Tool::"query");')
    anyone = engine.principal("u", {})
    assert engine.visibility(anyone, CATALOG).names("tool") == {"query"}
    assert not engine.replace(compiled(f'permit(principal, {CALL}, resource == Tool::"query");  // the same'))
    assert engine.replace(compiled(f'permit(principal, {CALL}, resource in MCP::"github");'))
    assert engine.visibility(anyone, CATALOG).names("tool") == {"list_issues", "create_issue"}


def test_resources_whose_uris_sanitize_alike_are_each_answered() -> None:
    engine = authorizer(
        'permit(principal, action == Action::"read_resource", resource) when { resource.uri == "a/b" };'
    )
    slash, colon = Item.resource("a/b", "files"), Item.resource("a:b", "files")
    assert slash.uid == colon.uid
    seen = engine.visibility(engine.principal("u", {}), Catalog([slash, colon]))
    assert seen.of(slash).verdict is Verdict.ALLOWED and seen.of(colon).verdict is Verdict.DENIED


def test_an_entity_holding_tools_grants_them_one_by_one(tmp_path: Path) -> None:
    entities = [
        {
            "uid": {"type": "THVGroup", "id": "ops"},
            "attrs": {"tools": [{"__entity": {"type": "Tool", "id": "query"}}]},
        }
    ]
    policy = compiled(
        f'permit(principal in THVGroup::"ops", {CALL}, resource) '
        'when { THVGroup::"ops".tools.contains(resource) };',
        entities=entities,
        tmp=tmp_path,
    )
    engine = Authorizer(policy)
    operator = engine.principal("o", {"groups": ["ops"]})
    assert engine.visibility(operator, CATALOG).names("tool") == {"query"}
    assert engine.decide(operator, QUERY).allowed and not engine.decide(operator, DROP).allowed


def test_prompts_and_resources_are_seen_through_their_own_actions() -> None:
    engine = authorizer(
        'permit(principal, action == Action::"get_prompt", resource in MCP::"github");\n'
        'permit(principal, action == Action::"read_resource", resource) when { resource.uri like "file:*" };'
    )
    catalog = Catalog(
        [
            Item.prompt("triage", "github"),
            Item.prompt("summarize", "db"),
            Item.resource("file:///a", "db"),
            READ,
        ]
    )
    seen = engine.visibility(engine.principal("u", {}), catalog)
    assert [item.name for item in seen.visible] == ["triage", "file:///a"]


def test_fifty_callers_see_fifty_allowed_sets_from_one_catalog() -> None:
    tools = [Item.tool(f"t{n}", f"b{n}") for n in range(50)]
    rules = "\n".join(
        f'permit(principal in THVGroup::"g{n}", {CALL}, resource in MCP::"b{n}");' for n in range(50)
    )
    engine = authorizer(rules)
    catalog = Catalog(tools)
    seen = [engine.visibility(engine.principal(f"u{n}", {"groups": [f"g{n}"]}), catalog) for n in range(50)]
    assert [visibility.names("tool") for visibility in seen] == [{f"t{n}"} for n in range(50)]
    assert len({visibility.fingerprint for visibility in seen}) == 50
