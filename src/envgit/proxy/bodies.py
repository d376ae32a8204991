"""Request bodies: the gate buffers at most BODY_CAP bytes of one to judge it, then streams the
rest on (a 1 GiB upload costs the daemon one buffer, not a gigabyte), and decodes at most
BODY_CAP bytes of a Content-Encoding (a small gzip body cannot grow into a large one).

mitmproxy (12.3.1, pinned) either buffers a request body whole before the `request` hook or,
with `stream_large_bodies`, connects upstream and sends the headers before any of the body has
been seen. Neither fits: the gate must judge before anything reaches the server, on a bounded
part of the body. `install()` gives mitmproxy's HttpStream one more turn: once the buffered
body passes BODY_CAP, the `request` hook runs on those bytes, with
`flow.metadata[PARTIAL] = True`; then

- denied (the hook set a response): the rest of the body is read and dropped, and the denial
  is sent when the client has finished sending (git reads a push's rejection only then);
- allowed: the upstream connection is made, and the buffered bytes and the rest are streamed
  through `flow.request.stream` (the hook's callable, if it set one). mitmproxy then runs the
  `request` hook a second time at the end of the body (the addon ignores it). If the hook set
  `flow.metadata[CUT]` (a rule watches the rest: netrequest.Watch), each chunk is shown to it
  before it is sent; when it returns a reason, that chunk is not sent, the upstream connection
  is closed mid-body (the server never has the whole request), and the client gets the reason.

A body within BODY_CAP is buffered whole, as mitmproxy does by default.

Responses: a stream callable may raise `Cut`; the chunk is not sent, both connections are
closed (the step's client sees its body end early) and the flow's error says why
(echoguard.py cuts off a body carrying a real value it cannot rewrite).
"""

import time
import zlib
from typing import Any

from ..policy.netrequest import BODY_CAP
from .flowstate import CUT, PARTIAL


class Cut(Exception):
    """Raised by a response's stream callable: that chunk and the rest are not sent, both
    connections are closed (the step's client sees the body end early), the reason is the
    flow's error."""

_installed = False


def install() -> None:
    """Give mitmproxy's HTTP stream the bounded body buffer (once per process)."""
    global _installed
    if _installed:
        return
    from mitmproxy import flow as mflow
    from mitmproxy.proxy.layers import http as layer
    from mitmproxy.proxy.layers.http import (
        DropStream,
        ErrorCode,
        HttpErrorHook,
        HttpRequestHook,
        HttpResponseHeadersHook,
        RequestData,
        RequestEndOfMessage,
        RequestProtocolError,
        RequestTrailers,
        ResponseData,
        ResponseEndOfMessage,
        ResponseProtocolError,
        ResponseTrailers,
        SendHttp,
    )
    from mitmproxy.proxy.utils import expect

    consume = layer.HttpStream.state_consume_request_body

    @expect(RequestData, RequestTrailers, RequestEndOfMessage)
    def state_consume_request_body(self, event):
        if not isinstance(event, RequestData) or len(self.request_body_buf) + len(event.data) <= BODY_CAP:
            yield from consume(self, event)
            return
        self.request_body_buf += event.data
        prefix = bytes(self.request_body_buf)
        self.request_body_buf.clear()
        self.flow.request.data.content = prefix
        self.flow.metadata[PARTIAL] = True
        yield HttpRequestHook(self.flow)
        if (yield from self.check_killed(True)):
            return
        if self.flow.response is not None:
            self.client_state = self.state_drop_request_body
            return
        if not self.flow.request.stream:
            self.flow.request.stream = True
        yield from self.start_request_stream()
        if self.client_state == self.state_stream_request_body:
            if self.flow.metadata.get(CUT) is not None:
                self.client_state = self.state_stream_watched_body
            yield from self.handle_event(RequestData(self.stream_id, prefix))

    @expect(RequestData, RequestTrailers, RequestEndOfMessage)
    def state_stream_watched_body(self, event):
        """An allowed body streamed on, each chunk shown to the watch before it is sent."""
        why = self.flow.metadata[CUT](event.data) if isinstance(event, RequestData) else ""
        if not why:
            yield from self.state_stream_request_body(event)
            return
        self.flow.error = mflow.Error(why)
        yield SendHttp(RequestProtocolError(self.stream_id, why, ErrorCode.KILL), self.context.server)
        yield HttpErrorHook(self.flow)
        yield SendHttp(ResponseProtocolError(self.stream_id, why, ErrorCode.GENERIC_CLIENT_ERROR),
                       self.context.client)
        self.flow.live = False
        self.client_state = self.server_state = self.state_errored
        yield DropStream(self.stream_id)

    @expect(RequestData, RequestTrailers, RequestEndOfMessage)
    def state_drop_request_body(self, event):
        """A denied request's body, read to its end and dropped; then the denial."""
        if isinstance(event, RequestEndOfMessage):
            self.client_state = self.state_done
            self.flow.response.timestamp_start = time.time()
            yield HttpResponseHeadersHook(self.flow)
            if (yield from self.check_killed(True)):
                return
            yield from self.send_response()
        else:
            yield from ()

    stream_response = layer.HttpStream.state_stream_response_body

    @expect(ResponseData, ResponseTrailers, ResponseEndOfMessage)
    def state_stream_response_body(self, event):
        """A streamed response, cut off where its stream callable raises Cut."""
        try:
            yield from stream_response(self, event)
        except Cut as e:
            why = str(e)
            self.flow.error = mflow.Error(why)
            yield SendHttp(RequestProtocolError(self.stream_id, why, ErrorCode.KILL), self.context.server)
            yield HttpErrorHook(self.flow)
            yield SendHttp(ResponseProtocolError(self.stream_id, why, ErrorCode.GENERIC_CLIENT_ERROR),
                           self.context.client)
            self.flow.live = False
            self.client_state = self.server_state = self.state_errored
            yield DropStream(self.stream_id)

    # Two of mitmproxy's states replaced and two added: a patch of the class, untyped on purpose.
    stream: Any = layer.HttpStream
    stream.state_consume_request_body = state_consume_request_body
    stream.state_stream_response_body = state_stream_response_body
    stream.state_drop_request_body = state_drop_request_body
    stream.state_stream_watched_body = state_stream_watched_body
    _installed = True


# --- Content-Encoding, bounded ------------------------------------------------------------------

def decode(raw: bytes, encoding: str, complete: bool) -> tuple[bytes | None, bool, str]:
    """(at most BODY_CAP decoded bytes, whether that is the whole body, why it could not be
    decoded or ""). `complete`: `raw` is the whole (encoded) body."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return raw[:BODY_CAP], complete and len(raw) <= BODY_CAP, ""
    try:
        if enc in ("gzip", "x-gzip"):
            return _zlib(raw, zlib.decompressobj(16 + zlib.MAX_WBITS), complete)
        if enc == "deflate":      # zlib-wrapped as the RFC says, or raw as some clients send
            try:
                return _zlib(raw, zlib.decompressobj(zlib.MAX_WBITS), complete)
            except zlib.error:
                return _zlib(raw, zlib.decompressobj(-zlib.MAX_WBITS), complete)
        if enc == "br":
            return _brotli(raw, complete)
        if enc == "zstd":
            return _zstd(raw, complete)
    except (zlib.error, ValueError) as e:
        return None, complete, f"cannot decode Content-Encoding {encoding!r}: {e}"
    except Exception as e:                   # brotli.error is not a ValueError
        return None, complete, f"cannot decode Content-Encoding {encoding!r}: {e}"
    return None, complete, f"the gate does not decode Content-Encoding {encoding!r}"


def _zlib(raw, d, complete):
    out = d.decompress(raw, BODY_CAP + 1)
    if len(out) > BODY_CAP:
        return out[:BODY_CAP], False, ""
    if not complete:
        return out, False, ""
    if not d.eof:
        raise ValueError("the compressed body ends early")
    if d.unused_data or d.unconsumed_tail:
        raise ValueError("data after the end of the compressed body")
    return out, True, ""


def _zstd(raw, complete):
    import io

    import zstandard
    try:
        out = zstandard.ZstdDecompressor().stream_reader(   # every frame, as zstd(1) and curl read
            io.BytesIO(raw), read_across_frames=True).read(BODY_CAP + 1)
    except zstandard.ZstdError as e:
        if complete:
            raise ValueError(str(e)) from None
        return b"", False, ""              # a frame cut at the cap: nothing judged whole
    if len(out) > BODY_CAP:
        return out[:BODY_CAP], False, ""
    return out, complete, ""


def _brotli(raw, complete):
    import brotli
    d = brotli.Decompressor()
    out = d.process(raw, output_buffer_limit=BODY_CAP + 1)
    if len(out) > BODY_CAP:
        return out[:BODY_CAP], False, ""
    if not complete:
        return out, False, ""
    if not d.is_finished():
        raise ValueError("the compressed body ends early, or has data after its end")
    return out, True, ""
