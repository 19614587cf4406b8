"""A backend's outgoing auth, computed once in the base (toolsearch/outgoing.py) for both services.

In process, no network: a header-auth backend whose secret is missing is refused before any request
leaves, with one message naming the backend and the variable to set, whichever service asks.
"""

from __future__ import annotations

import pytest

from indexer.backends.lister import BackendLister
from indexer.backends.registry import Registry
from indexer.errors import BackendRejected, BackendSecretUnset
from router.errors import MissingCredentials
from router.upstream.calls.credentials import outgoing_headers
from toolsearch.outgoing import MissingCallerToken, MissingSecret, OutgoingAuth, auth_headers
from toolsearch.sections.backend_settings import Backend

REASON = "has no value for its credential: set the environment variable WEATHER_KEY"


def keyed_backend() -> Backend:
    return Backend.model_validate(
        {
            "id": "weather",
            "url": "http://weather.test/mcp",
            "auth": {"type": "header", "header": "X-Api-Key", "value_env": "WEATHER_KEY"},
        }
    )


def test_the_base_sends_the_configured_header_and_the_callers_token() -> None:
    keyed = OutgoingAuth("header", "X-Api-Key", "WEATHER_KEY")
    assert auth_headers("weather", keyed, {"WEATHER_KEY": "k"}, None) == {"X-Api-Key": "k"}
    assert auth_headers("weather", OutgoingAuth("passthrough"), {}, "tok") == {"Authorization": "Bearer tok"}
    assert auth_headers("weather", OutgoingAuth(), {"WEATHER_KEY": "k"}, "tok") == {}
    with pytest.raises(MissingCallerToken, match="backend weather requires the caller's bearer token"):
        auth_headers("weather", OutgoingAuth("passthrough"), {}, None)


def test_a_missing_secret_names_the_backend_and_the_variable_to_set() -> None:
    with pytest.raises(MissingSecret) as raised:
        auth_headers("weather", OutgoingAuth("header", "X-Api-Key", "WEATHER_KEY"), {"WEATHER_KEY": ""}, None)
    assert str(raised.value) == f"backend weather {REASON}"
    assert raised.value.variable == "WEATHER_KEY"


def test_the_router_refuses_a_call_to_a_backend_whose_secret_is_missing_with_that_message() -> None:
    with pytest.raises(MissingCredentials) as raised:
        outgoing_headers("weather", OutgoingAuth("header", "X-Api-Key", "WEATHER_KEY"), {}, None)
    assert raised.value.backend_id == "weather" and raised.value.reason == REASON


async def test_the_indexer_judges_a_backend_whose_secret_is_missing_unauthenticated_with_that_message() -> (
    None
):
    backend = keyed_backend()
    registry = Registry([backend])
    lister = BackendLister(registry, secrets={}, timeout=1.0)
    with pytest.raises(BackendSecretUnset) as raised:
        await lister.headers(backend, None)
    assert raised.value.reason == REASON and isinstance(raised.value, BackendRejected)
    # discovery lists it without a request leaving: the verdict and the reason the status page shows
    await lister.discover("weather")
    health = registry.get("weather").health
    assert health.status == "unauthenticated" and health.last_error == REASON
