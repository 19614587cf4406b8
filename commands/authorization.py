"""The `authorization` section checked before `up` or `indexer` starts anything.

A policy file the indexer would refuse (it does not parse, or names an action, entity type or
attribute the vocabulary lacks) is one line naming the file, line and column, and nothing starts.
Without the section nothing is checked: every caller may use every tool.
"""

from __future__ import annotations

from toolsearch.config import Config

# Sessions do not yet apply a policy: starting with one would let every caller use every tool.
NOT_APPLIED = (
    "authorization: {path} is a good policy ({count}), but this indexer cannot apply policies "
    "to sessions: remove the authorization section to start without one"
)


def policy_problem(config: Config) -> str | None:
    """Why the indexer cannot start with the configuration's authorization, in one line, or None."""
    if config.authorization is None:
        return None
    # the engine (and cedarpy) loaded only for a configuration that has a policy
    from indexer.authorization.policies import load_policy
    from indexer.authorization.source import PolicyError

    try:
        policy = load_policy(config.authorization)
    except PolicyError as exc:
        return str(exc)
    count = f"{len(policy.rules)} {'policy' if len(policy.rules) == 1 else 'policies'}"
    return NOT_APPLIED.format(path=policy.path, count=count)
