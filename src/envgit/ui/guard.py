"""Who may talk to the page: an ASGI middleware in front of every route.

- The server listens on 127.0.0.1 only (commands/ui.py binds the socket itself).
- Every request carries the token (`?token=` in its URL, or the `X-Envgit-Token` header),
  compared in constant time; without it: 403 and no data. There is no cookie: a browser
  sends a cookie set by 127.0.0.1 to every port of 127.0.0.1 (cookies are not scoped by
  port), so any other local server the browser visits would be handed it. Every link the
  page makes carries the token instead, and `Referrer-Policy: no-referrer` keeps it out of
  Referer headers (the page links nowhere else anyway).
- The `Host` header must be exactly `127.0.0.1:PORT`, the address the page was served on: a
  DNS-rebound name (evil.example resolving to 127.0.0.1) is refused before any route runs.
- A state-changing request is a POST with the token in the `X-Envgit-Token` header (a form
  on another site cannot set a header), an `Origin` that is the page's own, a
  `Sec-Fetch-Site` (when the browser sends one) of `same-origin`, and a JSON body. Any other
  method than GET, HEAD and POST is refused.
- Every response carries a strict CSP (no inline script or style, nothing from elsewhere,
  no framing), `X-Frame-Options: DENY`, `nosniff`, `no-referrer`, `no-store`.
"""

import hmac
from urllib.parse import parse_qs

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class Guard:
    def __init__(self, app, token: str, host: str, port: int):
        self.app, self.token = app, token.encode()
        self.host = f"{host}:{port}".encode()
        self.origin = f"http://{host}:{port}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":            # the page has none: closed before accepting
            return await send({"type": "websocket.close", "code": 1008})
        if scope["type"] != "http":
            return await self.app(scope, receive, send)          # lifespan

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                message = {**message, "headers": list(message.get("headers", []))
                           + [h for h in HEADERS if h[0] not in have]}
            await send(message)

        refusal = self.refusal(scope)
        if refusal is not None:
            status, text = refusal
            return await _plain(send_with_headers, status, text)
        return await self.app(scope, receive, send_with_headers)

    def refusal(self, scope):
        """(status, text) to refuse the request with, or None to let it through."""
        headers: dict[bytes, list[bytes]] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.lower(), []).append(v)
        host = headers.get(b"host", [])
        if len(host) != 1 or host[0] != self.host:
            return 403, "refused: this page answers only at the address envgit ui printed"
        header_token = headers.get(b"x-envgit-token", [])
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        url_token = query.get("token", [])
        given = header_token + [t.encode("latin-1", "replace") for t in url_token]
        if not given or not all(hmac.compare_digest(t, self.token) for t in given):
            return 403, "refused: open the URL envgit ui printed (it carries the token)"
        method = scope.get("method", "GET")
        if method in ("GET", "HEAD"):
            return None
        if method != "POST":
            return 405, "refused: GET and POST only"
        if len(header_token) != 1:
            return 403, "refused: a change needs the token in the X-Envgit-Token header"
        if headers.get(b"origin", []) != [self.origin]:
            return 403, "refused: a change must come from the page itself (Origin)"
        site = headers.get(b"sec-fetch-site")
        if site is not None and site != [b"same-origin"]:
            return 403, "refused: a change must come from the page itself (Sec-Fetch-Site)"
        ctype = b";".join(headers.get(b"content-type", [])).split(b";")[0].strip().lower()
        if ctype != b"application/json":
            return 415, "refused: a change is sent as JSON"
        return None


async def _plain(send, status, text):
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
