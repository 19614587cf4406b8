"""A policy file's text, cut into Cedar's tokens and policies, so that a refusal names a line and column.

cedarpy's errors say what is wrong but not where. The file is cut here the way Cedar's own lexer cuts
it (identifiers, numbers, strings, punctuation; `//` comments and spaces between), and into its
policies at each `;` outside brackets, in order: the n-th policy is Cedar's `policy<n>`. A parse
error is then found by parsing policy after policy, and inside the first that fails by the shortest
run of its tokens that fails other than by ending early (policies.py); a name the vocabulary lacks
is found by its tokens (checks.py).
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TokenKind = Literal["ident", "int", "string", "punct", "invalid"]

_TOKENS = re.compile(
    r"""(?P<space>\s+|//[^\n]*)
    |(?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<int>[0-9]+)
    |(?P<string>"(?:[^"\\]|\\.)*")
    |(?P<punct>::|==|!=|<=|>=|&&|\|\||[()\[\]{},;.@?<>!+\-*%:=/&|])
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", "0": "\0", "'": "'", '"': '"'}
_UNICODE = re.compile(r"\\u\{([0-9A-Fa-f]{1,6})\}|\\(.)", re.DOTALL)
_OPENING, _CLOSING = frozenset("([{"), frozenset(")]}")


class PolicyError(ValueError):
    """Raised when a policy or entities file is refused: one line, naming the file (and the line and
    column in a policy file) and what is wrong."""


@dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    text: str  # as written
    start: int  # offsets in the file's text
    end: int

    @property
    def value(self) -> str:
        """What the token means: a string's characters, its escapes undone; else its text."""
        return unescape(self.text[1:-1]) if self.kind == "string" else self.text


def unescape(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return chr(int(match.group(1), 16))
        return _ESCAPES.get(match.group(2), match.group(2))

    return _UNICODE.sub(one, text)


def tokens_of(text: str) -> list[Token]:
    """Every token of `text`; a character no token begins with (an unclosed quote) is an `invalid` one."""
    tokens, at = [], 0
    while at < len(text):
        match = _TOKENS.match(text, at)
        if match is None:
            tokens.append(Token("invalid", text[at], at, at + 1))
            at += 1
            continue
        kind = match.lastgroup
        if kind != "space":
            tokens.append(Token(kind, match.group(), at, match.end()))  # type: ignore[arg-type]
        at = match.end()
    return tokens


@dataclass(frozen=True, slots=True)
class Span:
    """One policy's tokens: `tokens[first:end]` of the file, its `;` included when it has one."""

    first: int
    end: int


class Source:
    """A policy file's text, its tokens and its policies, and where an offset is in it."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.text = text
        self.tokens = tokens_of(text)
        self.spans = list(_policy_spans(self.tokens))
        self._lines = [0, *(m.end() for m in re.finditer("\n", text))]

    def where(self, offset: int) -> str:
        """`file:line:column` of an offset, both counted from 1."""
        line = bisect.bisect_right(self._lines, offset)
        return f"{self.path}:{line}:{offset - self._lines[line - 1] + 1}"

    def refusal(self, offset: int, message: str) -> PolicyError:
        return PolicyError(f"{self.where(offset)}: {message}")

    def line(self, offset: int) -> int:
        return bisect.bisect_right(self._lines, offset)

    def span_tokens(self, span: Span) -> Sequence[Token]:
        return self.tokens[span.first : span.end]

    def text_of(self, tokens: Sequence[Token]) -> str:
        """The text from the first token to the last (comments between kept: offsets stay the file's)."""
        return self.text[tokens[0].start : tokens[-1].end] if tokens else ""

    def effect_offset(self, span: Span) -> int:
        """Where a policy's `permit` or `forbid` is (after its annotations), for `file:line` labels."""
        tokens = self.span_tokens(span)
        depth = 0
        for token in tokens:
            depth += (token.text in _OPENING) - (token.text in _CLOSING)
            if depth == 0 and token.text in ("permit", "forbid"):
                return token.start
        return tokens[0].start if tokens else 0

    def end_offset(self) -> int:
        return self.tokens[-1].end if self.tokens else 0


def _policy_spans(tokens: Sequence[Token]) -> Iterator[Span]:
    """Each policy's tokens: cut at every `;` outside brackets, and the tokens left after the last."""
    first, depth = 0, 0
    for index, token in enumerate(tokens):
        if token.text in _OPENING:
            depth += 1
        elif token.text in _CLOSING:
            depth = max(depth - 1, 0)
        elif token.text == ";" and depth == 0:
            yield Span(first, index + 1)
            first = index + 1
    if first < len(tokens):
        yield Span(first, len(tokens))


def find_sequence(tokens: Sequence[Token], *values: str) -> Token | None:
    """The token where `values` first run in a row (each compared with a token's `value`), or None."""
    width = len(values)
    for index in range(len(tokens) - width + 1):
        if all(tokens[index + n].value == values[n] for n in range(width)):
            return tokens[index]
    return None


def find_attribute(tokens: Sequence[Token], name: str) -> Token | None:
    """Where an attribute is read: `.name`, `["name"]`, `has name` or `has "name"`."""
    for before, token in itertools.pairwise(tokens):
        if token.value == name and before.text in (".", "[", "has"):
            return token
    return None


def find_entity_type(tokens: Sequence[Token], name: str) -> Token | None:
    """Where an entity type is written: `Type::"id"` (its first segment) or `is Type`."""
    first = name.split("::", maxsplit=1)[0]
    for index, token in enumerate(tokens):
        if token.kind != "ident" or token.text != first:
            continue
        after = tokens[index + 1].text if index + 1 < len(tokens) else ""
        before = tokens[index - 1].text if index > 0 else ""
        if after == "::" or before == "is":
            return token
    return None
