"""The conformance test server's tools that need answers from the client first
(tests/support/conformance_server.py): in 2026-07-28, input-required results, each round's requests
of the client with request state signed so that a tampered one is refused; in the handshake era,
which has no such result, the same requests asked on the call's stream, one after the other."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from tests.support.conformance_content import INPUT_ROUNDS

_KEY = secrets.token_bytes(32)  # signs request state: a tampered one is refused


def text(text: str, *, is_error: bool = False) -> dict[str, Any]:
    """A tool result of one text block."""
    return {"content": [{"type": "text", "text": text}], **({"isError": True} if is_error else {})}


def _sealed(state: dict[str, Any]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    mac = hmac.new(_KEY, body.encode(), hashlib.sha256).hexdigest()
    return f"{body}.{mac}"


def _unsealed(token: str) -> dict[str, Any]:
    body, _, mac = token.rpartition(".")
    expected = hmac.new(_KEY, body.encode(), hashlib.sha256).hexdigest()
    if not body or not hmac.compare_digest(mac, expected):
        raise MCPError(types.INVALID_PARAMS, "requestState failed its integrity check")
    state: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body))
    return state


def input_required(
    ctx: ServerRequestContext[Any], name: str, params: types.InputResponseRequestParams
) -> dict[str, Any]:
    """A 2026-07-28 tool or prompt that needs answers from the client: the rounds of INPUT_ROUNDS."""
    rounds = INPUT_ROUNDS[name]
    state = _unsealed(params.request_state) if params.request_state else {"round": 0}
    responses = _plain(params.input_responses)
    if responses is not None and not isinstance(responses, dict):
        raise MCPError(types.INVALID_PARAMS, "inputResponses must be an object of responses by key")
    step = int(state.get("round", 0))
    asked = rounds[step]
    if name == "test_input_required_result_capabilities":
        declared = (ctx.meta or {}).get(types.CLIENT_CAPABILITIES_META_KEY) or {}
        asked = {k: r for k, r in asked.items() if r["method"].split("/")[0] in _capability_names(declared)}
    answered = responses or {}
    for key in asked:
        if key in answered and not isinstance(answered[key], dict):
            raise MCPError(types.INVALID_PARAMS, f"inputResponses.{key} must be an object")
    if responses is None or not all(key in answered for key in asked):
        result: dict[str, Any] = {"resultType": "input_required", "inputRequests": asked}
        result["requestState"] = _sealed({"round": step, "seen": sorted(answered)})
        return result
    if step + 1 < len(rounds):
        return {
            "resultType": "input_required",
            "inputRequests": rounds[step + 1],
            "requestState": _sealed({"round": step + 1}),
        }
    return _finished(name, {key: answered[key] for key in asked}, bool(params.request_state))


# a request of the client on the call's stream, answered: its method, its params
Ask = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


async def asked_in_turn(name: str, ask: Ask, declared: Any) -> dict[str, Any]:
    """The same tool or prompt in the handshake era, which has no input-required result: each round's
    requests asked of the client on the call's stream (`ask`), one after the other, as a server of
    that era asks. `declared`: the capabilities the client declared at initialize."""
    answered: dict[str, Any] = {}
    for requests in INPUT_ROUNDS[name]:
        asked = requests
        if name == "test_input_required_result_capabilities":
            kinds = _capability_names(declared)
            asked = {k: r for k, r in requests.items() if r["method"].split("/")[0] in kinds}
        answered = {key: await ask(r["method"], r.get("params", {})) for key, r in asked.items()}
    return _finished(name, answered, True)


def _finished(name: str, answered: dict[str, Any], with_state: bool) -> dict[str, Any]:
    """What the tool or prompt answers once its last round's requests are answered."""
    gathered = json.dumps(answered, sort_keys=True)
    if name == "test_input_required_result_prompt":
        return {"messages": [{"role": "user", "content": {"type": "text", "text": f"context: {gathered}"}}]}
    prefix = "state-ok " if with_state else ""
    return text(f"{prefix}Hello, {gathered}")


def _plain(value: Any) -> Any:
    """A parsed value as the wire has it (the SDK hands input responses over as models)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _capability_names(declared: Any) -> set[str]:
    """The kinds of request (`sampling`, `elicitation`, `roots`) a client declared it answers."""
    return set(declared) & {"roots", "sampling", "elicitation"} if isinstance(declared, dict) else set()
