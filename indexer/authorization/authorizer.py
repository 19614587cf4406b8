"""The policy in force and the two questions asked of it: what a principal may see, and whether a call
may run. The one place the indexer decides authorization (the routers enforce what it answers).

A new policy replaces the old in one assignment, with everything computed under the old one: a
question in flight answers under the policy it started with, the next under the new one. Answers
are kept, bounded, by what decides them: the policy (one `InForce` each), the catalog's fingerprint,
and the principal as the policy reads it (its subject only when a rule names callers, its groups,
the claims some rule reads), so that a refreshed token, whose `exp` and `iat` change, is the same
principal and finds its answer kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from indexer.authorization.calls import decide
from indexer.authorization.catalog import Catalog, Item
from indexer.authorization.policies import Policy
from indexer.authorization.principal import PolicyPrincipal
from indexer.authorization.sets import Bounded, RuleSets
from indexer.authorization.verdicts import Decision, Visibility
from indexer.authorization.views import Prepared
from indexer.authorization.visibility import Asker
from indexer.authorization.vocabulary import CLAIM, CLAIM_SET

CATALOGS_KEPT = 32  # catalogs prepared under the policy in force (each as many entities as it has items)
ANSWERS_KEPT = 512  # visibility answers kept: (principal, catalog) pairs


class InForce:
    """One policy and what is computed under it."""

    def __init__(self, policy: Policy, catalogs: int = CATALOGS_KEPT, answers: int = ANSWERS_KEPT) -> None:
        self.policy = policy
        self.sets = RuleSets(policy)
        self.catalogs: Bounded[str, Prepared] = Bounded(catalogs)
        self.answers: Bounded[tuple[str, str], Visibility] = Bounded(answers)

    def principal_key(self, principal: PolicyPrincipal) -> str:
        """What of a principal can change an answer under this policy."""
        read = self.policy.claims_read
        claims = {
            name: value
            for name, value in principal.attributes.items()
            if name.removeprefix(CLAIM_SET if name.startswith(CLAIM_SET) else CLAIM) in read
        }
        subject = principal.subject if self.policy.subject_read else ""
        return json.dumps([subject, sorted(principal.groups), claims], sort_keys=True)


class Authorizer:
    """Answers authorization questions under the policy in force; `replace` puts another in force."""

    def __init__(self, policy: Policy) -> None:
        self._in_force = InForce(policy)

    @property
    def policy(self) -> Policy:
        return self._in_force.policy

    def replace(self, policy: Policy) -> bool:
        """Put a policy in force; whether it decides differently (its fingerprint is another)."""
        if policy.fingerprint == self._in_force.policy.fingerprint:
            return False
        self._in_force = InForce(policy)
        return True

    def principal(self, subject: str, claims: Mapping[str, Any]) -> PolicyPrincipal:
        """A token holder as the policy's claim settings make it a principal."""
        return PolicyPrincipal.of(subject, claims, self._in_force.policy.settings)

    def visibility(self, principal: PolicyPrincipal, catalog: Catalog) -> Visibility:
        """Every item of the catalog as the principal may see it (blocking: CPU-bound, run it off the
        event loop; safe from several threads)."""
        in_force = self._in_force
        key = (in_force.principal_key(principal), catalog.fingerprint)
        if (kept := in_force.answers.get(key)) is not None and kept.catalog.items == catalog.items:
            return kept
        prepared = in_force.catalogs.get_or_make(
            catalog.fingerprint, lambda: Prepared(catalog, in_force.policy.entities)
        )
        if prepared.catalog.items != catalog.items:  # the same items in another order
            prepared = Prepared(catalog, in_force.policy.entities)
        seen = Asker(in_force.policy, in_force.sets, principal).seen(prepared)
        return in_force.answers.put(key, Visibility(catalog, tuple(seen), in_force.policy.fingerprint))

    def decide(
        self, principal: PolicyPrincipal, item: Item, arguments: Mapping[str, Any] | None = None
    ) -> Decision:
        """Whether the principal may call the tool (get the prompt, read the resource) with these
        arguments; blocking, a fraction of a millisecond."""
        return decide(self._in_force.policy, principal, item, arguments)
