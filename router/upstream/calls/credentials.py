"""The credentials each request to a backend carries, for the caller in hand (docs/auth.md).

`none`, `header` and `passthrough` backends get their header from the configuration and the request
(toolsearch/outgoing.py). A `token_exchange` backend gets a token minted for it: the indexer
exchanges the caller's token at the backend's token endpoint and keeps the result per principal and
backend in the state every replica shares, so this router holds no token between requests and
every replica uses the one exchange. The caller's own token goes to a `passthrough` backend and to
the indexer (to be exchanged), to nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.caller import Identity
from router.errors import MissingCredentials
from router.link.indexer_client import IndexerClient
from toolsearch.outgoing import AuthSettings, OutgoingAuthError, auth_headers
from toolsearch.targets import BackendTarget


def outgoing_headers(
    backend_id: str,
    auth: AuthSettings,
    secrets: Mapping[str, str],
    bearer_token: str | None,
    exchanged: str | None = None,
) -> dict[str, str]:
    """The headers that authenticate a call to a backend (toolsearch/outgoing.py); `exchanged` is a
    token_exchange backend's token.

    Raises `MissingCredentials` for a missing secret or caller token, before anything is sent.
    """
    try:
        return auth_headers(backend_id, auth, secrets, bearer_token, exchanged)
    except OutgoingAuthError as exc:
        raise MissingCredentials(backend_id, exc.reason) from None


class OutgoingCredentials:
    """The headers that authenticate a request to a backend, computed for each request."""

    def __init__(self, indexer: IndexerClient, secrets: Mapping[str, str]) -> None:
        self.indexer = indexer
        self.secrets = secrets  # the values of `header` backends' variables

    async def headers(self, target: BackendTarget, identity: Identity, renew: bool = False) -> dict[str, str]:
        """The headers for `target` on behalf of `identity`; never logged.

        `renew`: the exchanged token this caller used was refused by the backend: exchange anew.
        Raises `MissingCredentials`, `ExchangeFailed` or `ExchangeRefused` before anything is sent.
        """
        exchanged = None
        if target.auth.type == "token_exchange":
            if not identity.bearer_token:
                raise MissingCredentials(target.backend_id, "requires the caller's bearer token")
            exchanged = await self.indexer.exchange_token(
                identity.principal, identity.bearer_token, target.backend_id, renew
            )
        return outgoing_headers(
            target.backend_id, target.auth, self.secrets, identity.bearer_token, exchanged
        )
