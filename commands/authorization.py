"""The `authorization` section checked before `up` or `indexer` starts anything.

A policy file the indexer would refuse (it does not parse, or names an action, entity type or
attribute the vocabulary lacks) is one line naming the file, line and column, and nothing starts.
Without the section nothing is checked: every caller may use every tool, which `toolsearch up`'s
banner says; with a good file the banner names it in force.
"""

from __future__ import annotations

from toolsearch.config import Config

# what `toolsearch up`'s banner says of a good policy
IN_FORCE = (
    "authorization: {path} in force ({count}): what no policy permits is denied (docs/authorization.md)"
)
OPEN_TO_EVERY_CALLER = "authorization: none, every caller may use every tool (docs/authorization.md)"


def policy_problem(config: Config) -> str | None:
    """Why the indexer cannot start with the configuration's authorization, in one line, or None."""
    return policy_checked(config)[0]


def policy_checked(config: Config) -> tuple[str | None, str]:
    """The configuration's policy checked: why the indexer cannot start with it (or None), and what
    the banner says of authorization."""
    if config.authorization is None:
        return None, OPEN_TO_EVERY_CALLER
    # the engine (and cedarpy) loaded only for a configuration that has a policy
    from indexer.authorization.policies import load_policy
    from indexer.authorization.source import PolicyError

    try:
        policy = load_policy(config.authorization)
    except PolicyError as exc:
        return str(exc), ""
    count = f"{len(policy.rules)} {'policy' if len(policy.rules) == 1 else 'policies'}"
    return None, IN_FORCE.format(path=policy.path, count=count)
