"""A policy file, read, checked and compiled once: what every question of the engine starts from.

`load_policy(settings)` reads `authorization.policies` (and `entities_file`) and returns a `Policy`,
or raises `PolicyError` with one line: the file, the line and column, what is wrong. A file is
refused when Cedar cannot parse it, when it holds a template (a `?principal` slot permits nothing
until linked), or when it names an action, an entity type or an attribute the vocabulary lacks
(checks.py). An empty file is a policy too: it permits nothing.

Each policy is labelled for logs and answers by its `@id` annotation, else `file:line` of its
`permit` or `forbid`. The fingerprint hashes what decides (the policies in Cedar's JSON form, the
labels, the entities, the claim settings), so that comments and spacing do not make one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import cedarpy

from indexer.authorization.checks import Vocabulary
from indexer.authorization.entities import NO_ENTITIES, StaticEntities, read_entities
from indexer.authorization.reads import Reads, for_visibility, reads_of
from indexer.authorization.source import PolicyError, Source, Span, Token
from toolsearch.sections.authorization_settings import Authorization

Effect = Literal["permit", "forbid"]
_ENDED_EARLY = "unexpected end of input"


@dataclass(frozen=True)
class Rule:
    """One policy of the file."""

    id: str  # Cedar's: policy<n>, the n-th of the file
    label: str  # its @id annotation, else file:line
    effect: Effect
    scope: Mapping[str, Any]  # the principal, action and resource constraints, in Cedar's JSON form
    reads: Reads
    visible: Mapping[str, Any]  # the policy as visibility asks it: arguments unknown (reads.py)


@dataclass(frozen=True)
class Policy:
    """A checked policy file: its rules, Cedar's set of them, its entities, its fingerprint."""

    path: Path
    rules: tuple[Rule, ...]
    policy_set: cedarpy.PolicySet = field(repr=False)
    entities: StaticEntities
    settings: Authorization
    fingerprint: str

    @cached_property
    def by_id(self) -> Mapping[str, Rule]:
        return {rule.id: rule for rule in self.rules}

    def label(self, policy_id: str) -> str:
        rule = self.by_id.get(policy_id)
        return rule.label if rule is not None else policy_id

    @cached_property
    def claims_read(self) -> frozenset[str]:
        """The claims some rule reads: the others cannot change an answer."""
        return frozenset(claim for rule in self.rules for claim in rule.reads.claims)

    @cached_property
    def subject_read(self) -> bool:
        """Whether some rule tells callers apart by more than their groups and claims."""
        return any(rule.reads.principal_whole for rule in self.rules) or any(
            kind == "Client" for kind, _ in self.entities.by_uid
        )


def load_policy(settings: Authorization) -> Policy:
    """Read and check the configured files; `PolicyError` (one line) when they are refused."""
    entities = NO_ENTITIES if settings.entities_file is None else read_entities(settings.entities_file)
    try:
        text = settings.policies.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{settings.policies}: cannot read the policy file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{settings.policies}: not a text file (Cedar policies are UTF-8)") from None
    return compile_policy(Source(settings.policies, text), settings, entities)


def compile_policy(source: Source, settings: Authorization, entities: StaticEntities = NO_ENTITIES) -> Policy:
    """Parse and check a policy file's text; `PolicyError` naming the line and column when refused."""
    try:
        policy_set = cedarpy.PolicySet.from_str(source.text)
        forms = json.loads(cedarpy.policies_to_json_str(source.text))
    except ValueError as exc:
        raise _parse_refusal(source, str(exc)) from None
    written = {**forms.get("templates", {}), **forms.get("staticPolicies", {})}
    if len(written) != len(source.spans):  # cut otherwise than Cedar did: say so rather than misplace
        raise PolicyError(f"{source.path}: the file's policies could not be told apart; end each with ;")
    vocabulary = Vocabulary(frozenset(settings.multi_valued_claims), entities)
    rules = []
    for index, span in enumerate(source.spans):
        form = written[f"policy{index}"]
        tokens = source.span_tokens(span)
        if problem := vocabulary.problem(form):
            found = problem.locate(tokens)
            raise source.refusal(found.start if found else tokens[0].start, problem.message)
        label = (
            form.get("annotations", {}).get("id")
            or f"{source.path}:{source.line(source.effect_offset(span))}"
        )
        scope = {key: form[key] for key in ("principal", "action", "resource")}
        rules.append(
            Rule(f"policy{index}", label, form["effect"], scope, reads_of(form), for_visibility(form))
        )
    return Policy(
        source.path, tuple(rules), policy_set, entities, settings, _fingerprint(rules, entities, settings)
    )


def _fingerprint(rules: Sequence[Rule], entities: StaticEntities, settings: Authorization) -> str:
    decides = {
        "rules": [[rule.label, rule.visible, rule.effect, rule.scope] for rule in rules],
        "entities": entities.text,
        "claims": [settings.group_claim_name, settings.role_claim_name, settings.multi_valued_claims],
    }
    return hashlib.sha256(json.dumps(decides, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _parse_refusal(source: Source, message: str) -> PolicyError:
    """Cedar's message, placed: in the first policy that fails alone, at the token it fails on."""
    for span in source.spans:
        tokens = source.span_tokens(span)
        try:
            cedarpy.PolicySet.from_str(source.text_of(tokens))
        except ValueError as exc:
            return source.refusal(_failing_offset(source, span, str(exc)), str(exc))
    return source.refusal(source.end_offset(), message)


def _failing_offset(source: Source, span: Span, message: str) -> int:
    """Where in one policy Cedar fails: the shortest run of its tokens that fails otherwise than by
    ending early is cut at the bad token; an error found only once the policy is whole (an unknown
    function, a misplaced entity) is placed at the name the message quotes."""
    tokens = source.span_tokens(span)
    if message == _ENDED_EARLY:
        return tokens[-1].end
    if "invalid token" in message and (bad := next((t for t in tokens if t.kind == "invalid"), None)):
        return bad.start
    low, high = 1, len(tokens)  # the whole fails: the shortest failing run is in [low, high]
    while low < high:
        middle = (low + high) // 2
        if _fails_before_end(source, tokens[:middle]):
            high = middle
        else:
            low = middle + 1
    if message.startswith("integer parse error") and (large := _too_large(tokens)):
        return large.start
    if high < len(tokens) or message.startswith("unexpected token"):
        return tokens[high - 1].start
    quoted = _quoted(message, tokens)
    return quoted.start if quoted is not None else tokens[0].start


def _too_large(tokens: Sequence[Token]) -> Token | None:
    """The first integer beyond Cedar's 64 bits."""
    return next((t for t in tokens if t.kind == "int" and int(t.text) >= 2**63), None)


def _fails_before_end(source: Source, tokens: Sequence[Token]) -> bool:
    try:
        cedarpy.PolicySet.from_str(source.text_of(tokens))
    except ValueError as exc:
        return str(exc) != _ENDED_EARLY
    return False


def _quoted(message: str, tokens: Sequence[Token]) -> Token | None:
    """The first token a name quoted in the message (`name`, 'name', or after the last colon) begins."""
    candidates = [part for index, part in enumerate(message.split("`")) if index % 2]
    candidates += [part for index, part in enumerate(message.split("'")) if index % 2]
    candidates.append(message.rpartition(": ")[2])
    for candidate in reversed(candidates):
        for index in range(len(tokens)):
            written = ""
            for token in tokens[index:]:
                written += token.text
                if written == candidate:
                    return tokens[index]
                if not candidate.startswith(written):
                    break
    return None
