"""A `101 Switching Protocols` is let through only as the WebSocket the request asked for.

mitmproxy (12.3.1) switches a connection to relaying WebSocket frames on any 101 whose
`Upgrade` says websocket, if the request carried `Sec-WebSocket-Version: 13`: it checks
neither that the request asked to upgrade (`Upgrade: websocket`, `Connection: upgrade`; the
policy judges an upgrade by those, and refuses it on every judged host unless
`network.l7[host].websocket: allow`) nor the handshake's `Sec-WebSocket-Accept`. A server the
step controls could so open a WebSocket the policy never allowed, and its Ping frames pass
unlooked at. Any other 101 is answered (judge.py, Judge.responseheaders) with a 502, on
every host; mitmproxy then relays nothing after it.
"""

import base64
import hashlib

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"     # RFC 6455, 1.3


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",") if t.strip()}


def invalid(request, response) -> str | None:
    """Why this 101 is not the WebSocket handshake the request asked for, or None."""
    key = request.headers.get("sec-websocket-key", "").strip()
    if "websocket" not in _tokens(request.headers.get("upgrade", "")) or \
            "upgrade" not in _tokens(request.headers.get("connection", "")) or not key:
        return "the request asked for no WebSocket upgrade"
    if response.headers.get("upgrade", "").strip().lower() != "websocket":
        return "the response upgrades to something other than a WebSocket"
    accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
    if response.headers.get("sec-websocket-accept", "").strip() != accept:
        return "the response's Sec-WebSocket-Accept does not answer the request's key"
    return None
