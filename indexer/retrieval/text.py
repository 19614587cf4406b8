"""The text a tool is embedded and matched by, and how queries and names are normalised.

A tool is read through its backend's name, its own name split into words, its title, its
description and its parameters (names and descriptions): `tool_text`. The lexical arm indexes all
of it, the head (backend and name) counted twice (`lexical_text`). The dense arm embeds several
views of it (`document_views`): a short head view (backend, name and description) and the full
text cut into chunks the model reads whole, so that nothing past the model's window is silently
dropped. A query is embedded whole and, when it asks for several things, need by need as well
(`query_texts`): its sentences, cut further at list items, numbered steps, semicolons and words that
chain steps ("and then", "also"), so a request for two things matches each tool through the part
that asks for it. A server is read as a unit too (`server_text`): its name, what it says of itself,
and a line per tool.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bm25s.stopwords import STOPWORDS_EN

MAX_QUERY_PARTS = 24  # needs embedded beside the whole query: a cap on a find_tool's model work
MIN_PART_TERMS = 2  # a part with fewer content words ("ok", "Thanks!") names no need
SERVER_LINE_CHARS = 120  # of each tool's description in its server's text: the first sentence, at most
SERVER_ABOUT_CHARS = 600  # of what a server says of itself (title, description, instructions)
CHUNK_OVERLAP_WORDS = 16  # words repeated across chunk boundaries, so no phrase is only ever cut
_SPECIAL_TOKENS = 2  # [CLS] and [SEP], counted by the model but not part of the text
# Room a tokenizer may take beside the text's own characters: the special tokens, and a
# SentencePiece-style word marker at the start that stands for no character.
_UNCOUNTED_ROOM = _SPECIAL_TOKENS + 1

_ACRONYM = re.compile(r"([A-Z]+)([A-Z][a-z])")  # HTTPServer -> HTTP Server
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")  # getForecast -> get Forecast
_SEPARATORS = re.compile(r"[\W_]+")
_MARKUP = re.compile(r"[*`#|>]+|<[^>]{1,40}>")  # markdown emphasis, code ticks, short html tags
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE_END = re.compile(r"(?<=[.?!;])\s+|\n+")
# a list item or numbered step at the start of a line: "- ", "* ", "• ", "1. ", "2) "
_LIST_ITEM = re.compile(r"(?:^|\n)[ \t]*(?:[-*\u2022\u2013]|\d{1,2}[.)])[ \t]+")
# inside a sentence, where one step ends and the next begins
_STEP = re.compile(
    r",?\s+\b(?:and then|then|after that|afterwards|finally|also|as well as)\b\s+|;\s*|:\s+(?=\S)",
    re.IGNORECASE,
)
_FIRST_SENTENCE = re.compile(r"(?<=[.!?])\s")
_STOPWORDS = frozenset(STOPWORDS_EN)


def split_identifier(name: str) -> str:
    """An identifier as words: `get_forecast`, `getForecast` and `get-forecast` all give `get forecast`."""
    spaced = _CAMEL.sub(r"\1 \2", _ACRONYM.sub(r"\1 \2", name))
    return " ".join(_SEPARATORS.sub(" ", spaced).split())


def name_key(name: str) -> str:
    """The form names are compared in for exact lookups: lower-case words joined by underscores."""
    return "_".join(split_identifier(name).lower().split())


def clean(text: str) -> str:
    """Description text without markup noise, on one line."""
    return _SPACE.sub(" ", _MARKUP.sub(" ", text)).strip()


def _parameters(definition: Mapping[str, Any]) -> list[tuple[str, str]]:
    schema = definition.get("inputSchema")
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping):
        return []
    out: list[tuple[str, str]] = []
    for key, spec in properties.items():
        description = spec.get("description") if isinstance(spec, Mapping) else None
        out.append((str(key), clean(description) if isinstance(description, str) else ""))
    return out


def _head(definition: Mapping[str, Any], backend: str) -> str:
    """Backend, name and title (when it says more than the name), as words."""
    name = split_identifier(str(definition.get("name", "")))
    title = definition.get("title")
    title_words = split_identifier(title) if isinstance(title, str) else ""
    parts = [split_identifier(backend), name]
    if title_words.lower() != name.lower():
        parts.append(clean(title) if isinstance(title, str) else "")
    return " ".join(part for part in parts if part)


def _description(definition: Mapping[str, Any]) -> str:
    description = definition.get("description")
    return clean(description) if isinstance(description, str) else ""


def tool_text(definition: Mapping[str, Any], backend: str) -> str:
    """The full text of a tool: head, description, then each parameter's name and description."""
    return _full_text(definition, _head(definition, backend), _description(definition))


def _full_text(definition: Mapping[str, Any], head: str, description: str) -> str:
    text = f"{head}: {description}" if description else head
    parameters = _parameters(definition)
    if parameters:
        listed = "; ".join(
            split_identifier(key) + (f" ({about})" if about else "") for key, about in parameters
        )
        text += f" Parameters: {listed}"
    return text


def lexical_text(definition: Mapping[str, Any], backend: str) -> str:
    """What BM25 indexes: the full text with the head (backend and name) once more, as a field weight."""
    head = _head(definition, backend)
    return f"{head} {_full_text(definition, head, _description(definition))}"


def estimate_word_pieces(text: str) -> int:
    """Word pieces an embedding model reads of a text, estimated without its tokenizer.

    A word of English is about 1.3 pieces and symbols are more, so it takes the larger of a word-based
    and a character-based count; the default `count_tokens` where the embedder's own is not given.
    """
    return _SPECIAL_TOKENS + max(len(text.split()) * 4 // 3, len(text) // 4)


def fits_window(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> bool:
    """Whether the model reads `text` whole; a short ASCII text is known to fit without a count.

    Each word piece of an ASCII text covers at least one of its characters, so a text that leaves room
    for the special tokens cannot exceed the window. Other texts may grow when a tokenizer decomposes
    them (Hangul into jamo, or UTF-8 bytes as pieces), so they are counted.
    """
    return (len(text) <= max_tokens - _UNCOUNTED_ROOM and text.isascii()) or count_tokens(text) <= max_tokens


def document_chunks(
    text: str,
    prefix: str = "",
    count_tokens: Callable[[str], int] = estimate_word_pieces,
    max_tokens: int = 256,
) -> list[str]:
    """`text` in overlapping pieces the model reads whole; every piece after the first starts with `prefix`.

    Pieces are cut by words at the text's measured word-piece rate, then any piece that still does
    not fit (dense runs of symbols, code, URLs) is halved until it does; a word longer than a
    piece may be is cut first (a word piece is at least one character).
    """
    if fits_window(text, count_tokens, max_tokens):
        return [text]
    budget = max(16, max_tokens - (count_tokens(prefix) if prefix else 0) - 3)  # room beside "prefix: "
    words = [word[i : i + budget] for word in text.split() for i in range(0, len(word), budget)]
    per_chunk = max(1, int(budget * 0.9) * len(words) // max(count_tokens(" ".join(words)), 1))
    step = max(1, per_chunk - CHUNK_OVERLAP_WORDS)

    def fits(piece: list[str]) -> bool:
        return fits_window(
            f"{prefix}: {' '.join(piece)}" if prefix else " ".join(piece), count_tokens, max_tokens
        )

    def halve(piece: list[str]) -> list[list[str]]:
        if len(piece) <= 1 or fits(piece):
            return [piece]
        middle = len(piece) // 2
        return halve(piece[:middle]) + halve(piece[middle:])

    pieces: list[list[str]] = []
    for start in range(0, len(words), step):
        pieces.extend(halve(words[start : start + per_chunk]))
        if start + per_chunk >= len(words):
            break
    chunks = [" ".join(piece) for piece in pieces]
    return [chunks[0]] + [f"{prefix}: {chunk}" if prefix else chunk for chunk in chunks[1:]]


def document_views(
    definition: Mapping[str, Any],
    backend: str,
    count_tokens: Callable[[str], int] = estimate_word_pieces,
    max_tokens: int = 256,
) -> list[str]:
    """The texts the dense arm embeds for one tool; the tool scores as its best-matching view.

    The head view (backend, name, description) keeps what a tool is for from being diluted by
    its parameters; the full text, chunked to the model's window, covers everything else.
    """
    return document_texts(definition, backend, count_tokens, max_tokens)[0]


def document_texts(
    definition: Mapping[str, Any],
    backend: str,
    count_tokens: Callable[[str], int] = estimate_word_pieces,
    max_tokens: int = 256,
) -> tuple[list[str], str]:
    """A tool's views (`document_views`) and its lexical text (`lexical_text`), its text derived once."""
    head, description = _head(definition, backend), _description(definition)
    full = _full_text(definition, head, description)
    short = f"{head}: {description}" if description else head
    views = document_chunks(short, head, count_tokens, max_tokens)[:1]
    for chunk in document_chunks(full, head, count_tokens, max_tokens):
        if chunk not in views:
            views.append(chunk)
    return views, f"{head} {full}"


def query_text(query: str, keywords: Sequence[str] = ()) -> str:
    """The whole query as it is embedded; keywords feed the lexical arm, and stand in for an empty query."""
    text = _SPACE.sub(" ", query).strip()
    return text or " ".join(k.strip() for k in keywords if k.strip())


def query_needs(query: str) -> list[str]:
    """The needs a query states: its sentences, each cut at list items, numbered steps, semicolons,
    colons and words that chain steps ("and then", "then", "after that", "finally", "also").

    A part with fewer than MIN_PART_TERMS content words (a greeting, "ok") is no need and is left out;
    a sentence that is one step stays as written.
    """
    needs: list[str] = []
    for item in _LIST_ITEM.split("\n" + query):
        for sentence in _SENTENCE_END.split(item):
            pieces = _STEP.split(sentence)
            for piece in pieces:
                text = _SPACE.sub(" ", piece).strip()
                if len(pieces) > 1:
                    text = text.strip(" ,;:")
                if text and text not in needs and len(lexical_tokens([text])) >= MIN_PART_TERMS:
                    needs.append(text)
    return needs


def query_texts(query: str, keywords: Sequence[str] = ()) -> list[str]:
    """What to embed for a query: the whole query first, then each of its needs when it has several."""
    whole = query_text(query, keywords)
    needs = query_needs(query)
    if len(needs) < 2:
        return [whole]
    return [whole, *needs[:MAX_QUERY_PARTS]]


def server_text(backend: str, definitions: Sequence[Mapping[str, Any]], about: str = "") -> tuple[str, str]:
    """A server as one unit: its head (name, and what it says of itself), then a line per tool.

    Each tool line is its name as words and the first sentence of its description, so the text says
    what the server as a whole is for even when no single tool's text does. Returns the head (which
    every chunk of a long text starts with) and the text.
    """
    about = clean(about)[:SERVER_ABOUT_CHARS]
    head = " ".join(part for part in (split_identifier(backend), about) if part)
    lines = []
    for definition in definitions:
        name = split_identifier(str(definition.get("name", "")))
        first = _FIRST_SENTENCE.split(_description(definition), maxsplit=1)[0][:SERVER_LINE_CHARS]
        lines.append(f"{name} ({first})" if first else name)
    return head, f"{head}: {'; '.join(lines)}" if lines else head


_local = threading.local()


def _stemmer() -> Any:
    """This thread's Snowball stemmer: a PyStemmer object must not be shared between threads."""
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        # PyStemmer ships no type information; imported by name so the checker treats it as Any
        stemmer = _local.stemmer = importlib.import_module("Stemmer").Stemmer("english")
    return stemmer


def lexical_tokens(texts: Iterable[str]) -> list[str]:
    """BM25 terms of some texts: identifiers split, lower-cased, stop words dropped, Snowball-stemmed."""
    words = [
        word
        for text in texts
        for word in _WORD.findall(split_identifier(text).lower())
        if word not in _STOPWORDS
    ]
    stems: list[str] = _stemmer().stemWords(words)
    return stems
