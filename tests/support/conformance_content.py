"""What the conformance test server (tests/support/conformance_server.py) offers: its tools,
resources and prompts, and the answers the suite's scenarios expect of each, as wire JSON."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    for argument, about in properties.items():
        schema["properties"][argument] = {"type": "string", "description": about}
    if properties:
        schema["required"] = list(properties)
    return {"name": name, "description": description, "inputSchema": schema}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _embedded(uri: str, mime_type: str, text: str) -> dict[str, Any]:
    return {"type": "resource", "resource": {"uri": uri, "mimeType": mime_type, "text": text}}


TOOL_RESULTS: dict[str, dict[str, Any]] = {
    "test_simple_text": {"content": [_text("This is a simple text response for testing.")]},
    "test_image_content": {"content": [{"type": "image", "data": IMAGE, "mimeType": "image/png"}]},
    "test_audio_content": {"content": [{"type": "audio", "data": AUDIO, "mimeType": "audio/wav"}]},
    "test_embedded_resource": {
        "content": [
            _embedded("test://embedded-resource", "text/plain", "This is an embedded resource content.")
        ]
    },
    "test_multiple_content_types": {
        "content": [
            _text("Multiple content types test:"),
            {"type": "image", "data": IMAGE, "mimeType": "image/png"},
            _embedded(
                "test://mixed-content-resource",
                "application/json",
                json.dumps({"test": "data", "value": 123}),
            ),
        ]
    },
}

_ELICIT_FORM = {
    "type": "object",
    "properties": {
        "username": {"type": "string", "description": "User's response"},
        "email": {"type": "string", "description": "User's email address"},
    },
    "required": ["username", "email"],
}
_DEFAULTS_FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
    "required": [],
}


def _titled(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"const": value, "title": title} for value, title in pairs]


_ENUMS_FORM = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": _titled(
                ("value1", "First Option"), ("value2", "Second Option"), ("value3", "Third Option")
            ),
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": _titled(
                    ("value1", "First Choice"), ("value2", "Second Choice"), ("value3", "Third Choice")
                )
            },
        },
    },
    "required": [],
}

# the tools that ask their client during the call: (method, params, label of the answer) by arguments
ELICITATIONS: dict[str, Callable[[dict[str, Any]], tuple[str, dict[str, Any], str]]] = {
    "test_sampling": lambda a: (
        "sampling/createMessage",
        {"messages": [{"role": "user", "content": _text(str(a.get("prompt", "")))}], "maxTokens": 100},
        "Sampling",
    ),
    "test_elicitation": lambda a: (
        "elicitation/create",
        {"mode": "form", "message": str(a.get("message", "")), "requestedSchema": _ELICIT_FORM},
        "User response",
    ),
    "test_elicitation_sep1034_defaults": lambda a: (
        "elicitation/create",
        {"mode": "form", "message": "Please review the defaults", "requestedSchema": _DEFAULTS_FORM},
        "Elicitation completed",
    ),
    "test_elicitation_sep1330_enums": lambda a: (
        "elicitation/create",
        {"mode": "form", "message": "Please select options", "requestedSchema": _ENUMS_FORM},
        "Elicitation completed",
    ),
}


def _form(message: str, field: str, kind: str = "string") -> dict[str, Any]:
    schema = {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}
    return {"method": "elicitation/create", "params": {"message": message, "requestedSchema": schema}}


def _sampling(text: str, max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": _text(text)}]
    return {"method": "sampling/createMessage", "params": {"messages": messages, "maxTokens": max_tokens}}


_ROOTS = {"method": "roots/list", "params": {}}

# 2026-07-28 tools (and one prompt) answering with input-required results: each round's requests
INPUT_ROUNDS: dict[str, list[dict[str, dict[str, Any]]]] = {
    "test_input_required_result_elicitation": [{"user_name": _form("What is your name?", "name")}],
    "test_input_required_result_sampling": [
        {"capital_question": _sampling("What is the capital of France?", 100)}
    ],
    "test_input_required_result_list_roots": [{"client_roots": _ROOTS}],
    "test_input_required_result_request_state": [{"confirm": _form("Please confirm", "ok", "boolean")}],
    "test_input_required_result_multiple_inputs": [
        {
            "user_name": _form("What is your name?", "name"),
            "greeting": _sampling("Generate a greeting", 50),
            "client_roots": _ROOTS,
        }
    ],
    "test_input_required_result_multi_round": [
        {"step1": _form("Step 1: What is your name?", "name")},
        {"step2": _form("Step 2: What is your favorite color?", "color")},
    ],
    "test_streaming_elicitation": [{"user_name": _form("What is your name?", "name")}],
    "test_input_required_result_tampered_state": [{"confirm": _form("Please confirm", "ok", "boolean")}],
    "test_input_required_result_capabilities": [
        {"user_name": _form("What is your name?", "name"), "greeting": _sampling("Generate a greeting", 50)}
    ],
    "test_input_required_result_prompt": [
        {"user_context": _form("What context should the prompt use?", "context")}
    ],
}

TOOLS: list[dict[str, Any]] = [
    *(_tool(name, f"Answers the conformance scenario's {name}") for name in TOOL_RESULTS),
    _tool("test_error_handling", "Always fails, as a tool error"),
    _tool("test_tool_with_logging", "Sends three log messages during the call"),
    _tool("test_logging_tool", "Sends three log messages during the call"),
    _tool("test_tool_with_progress", "Reports progress 0, 50 and 100 of 100"),
    _tool("test_missing_capability", "Needs the client's sampling capability"),
    _tool("test_reconnection", "Closes the call's stream before its result, to be resumed"),
    _tool("test_sampling", "Asks the client's model", prompt="The prompt to send to the LLM"),
    _tool("test_elicitation", "Asks the user", message="The message to show the user"),
    _tool("test_elicitation_sep1034_defaults", "Asks the user, with defaults for every primitive type"),
    _tool("test_elicitation_sep1330_enums", "Asks the user, with every kind of enum"),
    *(
        _tool(name, "Needs answers from the client first (an input-required result)")
        for name in INPUT_ROUNDS
        if name != "test_input_required_result_prompt"
    ),
]

RESOURCES: list[dict[str, Any]] = [
    {
        "uri": uri,
        "name": name,
        "description": description,
        "mimeType": mime_type,
        "contents": {"uri": uri, "mimeType": mime_type, **body},
    }
    for uri, name, description, mime_type, body in (
        (
            "test://static-text",
            "static-text",
            "A static text resource",
            "text/plain",
            {"text": "This is the content of the static text resource."},
        ),
        ("test://static-binary", "static-binary", "A static binary resource", "image/png", {"blob": IMAGE}),
        (
            "test://watched-resource",
            "watched-resource",
            "A resource to subscribe to",
            "text/plain",
            {"text": "Watched resource content"},
        ),
    )
]


def template_contents(uri: str) -> dict[str, Any] | None:
    """The contents of a URI of the template `test://template/{id}/data`, or None."""
    found = re.fullmatch(r"test://template/([^/]+)/data", uri)
    if found is None:
        return None
    body = json.dumps({"id": found[1], "templateTest": True, "data": f"Data for ID: {found[1]}"})
    return {"uri": uri, "mimeType": "application/json", "text": body}


def _argument(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "description": description, "required": True}


PROMPTS: list[dict[str, Any]] = [
    {"name": "test_simple_prompt", "description": "A prompt without arguments"},
    {
        "name": "test_prompt_with_arguments",
        "description": "A prompt with two arguments",
        "arguments": [_argument("arg1", "First test argument"), _argument("arg2", "Second test argument")],
    },
    {
        "name": "test_prompt_with_embedded_resource",
        "description": "A prompt with an embedded resource",
        "arguments": [_argument("resourceUri", "URI of the resource to embed")],
    },
    {"name": "test_prompt_with_image", "description": "A prompt with an image"},
    {"name": "test_input_required_result_prompt", "description": "A prompt that needs the user's context"},
]


def prompt_messages(name: str, arguments: dict[str, str]) -> list[dict[str, Any]] | None:
    """The messages of a prompt of PROMPTS (not the input-required one), or None for another name."""
    if name == "test_simple_prompt":
        return [{"role": "user", "content": _text("This is a simple prompt for testing.")}]
    if name == "test_prompt_with_arguments":
        text = f"Prompt with arguments: arg1='{arguments.get('arg1')}', arg2='{arguments.get('arg2')}'"
        return [{"role": "user", "content": _text(text)}]
    if name == "test_prompt_with_embedded_resource":
        uri = arguments.get("resourceUri", "test://example-resource")
        return [
            {
                "role": "user",
                "content": _embedded(uri, "text/plain", "Embedded resource content for testing."),
            },
            {"role": "user", "content": _text("Please process the embedded resource above.")},
        ]
    if name == "test_prompt_with_image":
        return [
            {"role": "user", "content": {"type": "image", "data": IMAGE, "mimeType": "image/png"}},
            {"role": "user", "content": _text("Please analyze the image above.")},
        ]
    return None


def handshake_content() -> dict[str, Any]:
    """What a server of another SDK needs to offer the same (tests/servers/conformance-server.mjs),
    as JSON: the 2025-11-25 era's tools, results, resources and prompts. Text a call or a prompt
    takes from its arguments is a `{name}` placeholder, filled in by that server."""
    asking = {}
    for name, request in ELICITATIONS.items():
        (tool,) = [t for t in TOOLS if t["name"] == name]
        argument = next(iter(tool["inputSchema"]["properties"]), "")
        method, params, label = request({argument: "{argument}"} if argument else {})
        asking[name] = {"method": method, "params": params, "label": label, "argument": argument}
    placeholders = {key: f"{{{key}}}" for key in ("arg1", "arg2", "resourceUri")}
    modern = {*INPUT_ROUNDS, "test_missing_capability"}  # what needs the 2026-07-28 era
    return {
        "tools": [t for t in TOOLS if t["name"] not in modern],
        "results": TOOL_RESULTS,
        "asking": asking,
        "resources": RESOURCES,
        "templates": [
            {
                "uriTemplate": "test://template/{id}/data",
                "name": "template",
                "description": "A resource template with parameter substitution",
                "mimeType": "application/json",
            }
        ],
        "prompts": [p for p in PROMPTS if p["name"] not in modern],
        "prompt_messages": {
            p["name"]: prompt_messages(p["name"], placeholders) for p in PROMPTS if p["name"] not in modern
        },
        "prompt_defaults": {"resourceUri": "test://example-resource"},
    }
