"""Backend answers read with a size bound, so a backend cannot make the router or the indexer hold more.

`BoundedTransport` wraps an httpx2 transport for one call or listing. The answer to a POST (a tool
result, a tools/list page, an initialize answer) is read here in full, counted as it arrives and cut
at `limit` bytes: the caller then gets a stand-in 502 whose body is a JSON-RPC error, which the MCP
SDK hands to the waiting request as an error, and `exceeded` tells the caller why, for its message.
Reading it here rather than in the SDK is what bounds memory: an answer over the limit is never held
whole, and the connection it came on is dropped instead of drained. Other requests (the SDK's GET
stream, DELETE), and a POST whose request carries the `STREAMED` extension (a call whose
notifications are passed on as they arrive), stream through under the same count and raise
`ResponseTooLarge` past the limit. A transport made `per_event` counts a streamed answer one
server-sent event at a time instead, for an event stream that lasts as long as a session (the
bridge's legacy SSE sessions): each event may weigh `limit`, the stream as a whole anything.

Compression would let a small answer grow past the bound after it was counted, so requests ask for
`identity`; gzip or deflate sent anyway is decoded here and counted decoded, any other encoding is
refused. The wrapped transport is borrowed: closing this one never closes it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator

import httpx2

# Decompressed bytes produced per step: a small compressed chunk cannot expand all at once.
_DECODE_STEP = 64 * 1024
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")  # a blank line ends a server-sent event
STREAMED = "toolsearch.streamed"  # a request extension: stream this POST's answer under the count


class ResponseTooLarge(httpx2.TransportError):
    """Raised when a streamed answer grows past its transport's limit."""


class _Decoder:
    """gzip or deflate decoded in bounded steps."""

    def __init__(self, encoding: str) -> None:
        # 47: gzip or zlib headers, detected; deflate as sent is usually zlib-wrapped, sometimes raw
        self._raw_fallback = encoding == "deflate"
        self._zlib = zlib.decompressobj(15 if self._raw_fallback else 47)

    def decode(self, data: bytes, room: int) -> bytes:
        """Up to `room + 1` decoded bytes of `data`: one more than fits says the answer is too large."""
        try:
            out = self._zlib.decompress(data, min(room + 1, _DECODE_STEP))
            while self._zlib.unconsumed_tail and len(out) <= room:
                out += self._zlib.decompress(
                    self._zlib.unconsumed_tail, min(room + 1 - len(out), _DECODE_STEP)
                )
        except zlib.error:
            if not self._raw_fallback:
                raise httpx2.DecodingError("the answer is not valid gzip or deflate") from None
            self._raw_fallback = False
            self._zlib = zlib.decompressobj(-15)
            return self.decode(data, room)
        self._raw_fallback = False
        return out


def _decoder_for(encoding: str) -> _Decoder | None:
    """The decoder of a Content-Encoding; None for identity. Raises `DecodingError` for others."""
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip", "deflate"):
        return _Decoder(encoding)
    raise httpx2.DecodingError(f"Content-Encoding {encoding} is not accepted (it was asked for identity)")


def _stand_in(message: str) -> httpx2.Response:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": message}})
    return httpx2.Response(502, headers={"content-type": "application/json"}, content=body.encode())


class BoundedTransport(httpx2.AsyncBaseTransport):
    """`inner` with every answer cut at `limit` bytes; `exceeded` is set once one was."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int, per_event: bool = False) -> None:
        self._inner = inner
        self.limit = limit
        self.per_event = per_event  # a streamed answer's count starts again at each event's end
        self.exceeded = False

    def _too_large(self) -> httpx2.Response:
        self.exceeded = True
        return _stand_in(f"the answer is larger than {self.limit} bytes")

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["accept-encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)  # an async transport's answer
        encoding = response.headers.get("content-encoding", "").strip().lower()
        try:
            decoder = _decoder_for(encoding)
        except httpx2.DecodingError as exc:
            await stream.aclose()
            return _stand_in(str(exc))
        declared = response.headers.get("content-length", "")
        if decoder is None and declared.isdigit() and int(declared) > self.limit:
            await stream.aclose()  # refused unread: the connection is dropped, not drained
            return self._too_large()
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-encoding"]
        if request.method != "POST" or request.extensions.get(STREAMED):
            counted = _Counted(stream, self, decoder)
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            return httpx2.Response(response.status_code, headers=headers, stream=counted)
        body = bytearray()
        try:
            async for chunk in stream:
                data = chunk if decoder is None else decoder.decode(chunk, self.limit - len(body))
                if len(body) + len(data) > self.limit:
                    return self._too_large()
                body += data
        except httpx2.DecodingError as exc:
            return _stand_in(str(exc))
        finally:
            await stream.aclose()
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        return httpx2.Response(
            response.status_code, headers=headers, content=bytes(body), extensions=response.extensions
        )

    async def aclose(self) -> None:
        pass  # borrowed: its owner closes `inner`


class _Counted(httpx2.AsyncByteStream):
    """A streamed answer under its transport's count."""

    def __init__(
        self, raw: httpx2.AsyncByteStream, owner: BoundedTransport, decoder: _Decoder | None
    ) -> None:
        self._raw = raw
        self._owner = owner
        self._decoder = decoder
        self._seen = 0
        self._tail = b""  # the last bytes seen, for an event's end split across chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        limit = self._owner.limit
        async for chunk in self._raw:
            data = chunk if self._decoder is None else self._decoder.decode(chunk, limit - self._seen)
            if self._owner.per_event:
                window = self._tail + data
                ends = [at + len(mark) for mark in _EVENT_ENDS if (at := window.rfind(mark)) >= 0]
                self._seen = len(window) - max(ends) if ends else self._seen + len(data)
                self._tail = window[-3:]
            else:
                self._seen += len(data)
            if self._seen > limit:
                self._owner.exceeded = True
                raise ResponseTooLarge(f"the answer is larger than {limit} bytes")
            yield data

    async def aclose(self) -> None:
        await self._raw.aclose()
