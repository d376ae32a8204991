"""The echo guard: the addon that keeps real values out of what comes back to a step. Every
real value the gate knows (credvalues.py), in any form a header or body holds it
(credentials/echo.py), goes back as its placeholder, from any host; what cannot be rewritten
is withheld (a buffered body: a 502; a streamed one: cut off), recorded with rule
`credential-misuse`, kind `credential-echo`. Runs last (flowstate.py gives the order).

On a credential's own host (a server that was handed, or may know, the real value) a body
the gate cannot decode whole and look at is withheld the same way, whatever its content: an
unknown Content-Encoding (alone or in a stacked list), deflate with a preset dictionary, a
decoding error, a compressed body cut short or with data after its end. The step's client may
read what the gate could not. Elsewhere such a body passes unchanged, as downloads need.

Events: `responseheaders` (headers, the reason phrase, and how the body is looked at),
`response` (trailers), `websocket_message` (the server's messages), `error` (a real value in
the error text mitmproxy would answer the step with).
"""

from mitmproxy import http

from ..credentials import echo
from ..policy import hostnames, network
from ..policy.credcover import ECHO, RULE
from ..policy.netrequest import BODY_CAP
from . import bodies
from .credentials import websocket_denial
from .flows import denial_text, target
from .flowstate import ANSWERED, ON_BODY, RECORD


class EchoGuard:
    """One gate's answers with credentials. `gate` supplies the policy, the credentials
    (credvalues.CredentialValues) and the journal."""

    def __init__(self, gate):
        self.gate = gate
        self.known = gate.credentials

    def responseheaders(self, flow: http.HTTPFlow):
        """A server may echo what it was sent in its answer (a redirect's Location keeps the query,
        request-id middleware echoes X-Request-Id, CORS echoes Origin, a debug endpoint prints the
        request, a secrets API returns the token): every real value the gate knows goes back into
        the step as its placeholder, in the headers here and in the body (_body_watch), from any
        host."""
        policy = self.gate.policy()
        if flow.response is None or not getattr(policy, "credentials", None):
            return
        echoes = self.known.echoes(policy)
        if not echoes:
            return
        flow.response.headers.fields = self._scrub_fields(flow, flow.response.headers.fields, echoes)
        reason, found, left = echoes.scrub(flow.response.data.reason or b"", self._credential_host(flow))
        if found or left is not None:       # an error's text may quote the token it was sent
            flow.response.data.reason = b"" if left is not None else reason
            self._echoed(flow, found or [left])
        if not flow.metadata.get(ANSWERED):
            self._body_watch(flow, echoes)

    def _scrub_fields(self, flow, fields, echoes) -> tuple:
        """Header (or trailer) fields with every real value put back as its placeholder, in
        every form a body may hold it (a redirect's Location percent-encodes, a debug header
        may carry Basic credentials); a field holding one that cannot be is dropped. On a
        credential's host, a field holding one in a reading (a folded line, `%67hp_…`:
        credentials/readings.py) cannot be rewritten in its spelling: dropped too."""
        out, names = [], []
        deep = self._credential_host(flow)
        for k, v in fields:
            name, found_k, left_k = echoes.scrub(k, deep)
            clean, found, left = echoes.scrub(v, deep)
            names += found_k + found
            if left is None and left_k is None:
                out.append((name, clean))
            else:                       # dropped: recorded as an echo all the same
                names += [n for n in (left_k, left) if n is not None]
        if names:
            self._echoed(flow, names)
        return tuple(out)

    def response(self, flow: http.HTTPFlow):
        """The response's trailers (HTTP/2 only: mitmproxy drops HTTP/1 ones), before they
        are sent on."""
        if flow.response is not None and flow.response.trailers and \
                getattr(self.gate.policy(), "credentials", None):
            echoes = self.known.echoes(self.gate.policy())
            if echoes:
                flow.response.trailers.fields = self._scrub_fields(flow, flow.response.trailers.fields, echoes)

    def _body_watch(self, flow, echoes) -> None:
        """The response body: one declared (Content-Length) within BODY_CAP and not an event
        stream is buffered whole and rewritten (`on_body`, called before the request is
        recorded: flowstate.ON_BODY); a compressed one without a declared length, not an event
        stream, is gathered up to BODY_CAP and rewritten whole at its end (echo.Gather); any
        other is rewritten as it streams (echo.Stream), or cut off where it cannot be
        (compressed, base64, a length change under Content-Length)."""
        r = flow.response
        if flow.request.method == "HEAD" or r.status_code in (101, 204, 304):
            return              # no body (a WebSocket's messages: websocket_message)
        length = r.headers.get("content-length", "").strip()
        streaming = "text/event-stream" in r.headers.get("content-type", "").lower()
        if length.isdigit() and int(length) <= BODY_CAP and not streaming:
            r.stream = False
            flow.metadata[ON_BODY] = lambda flow: self._on_body(flow, echoes)
            return
        # A transfer coding other than chunked (`Transfer-Encoding: gzip, chunked`): the client
        # undoes it before the content coding, so it is read as the last content coding
        # applied (watched, never re-encoded: Gather is for content codings alone).
        codings = [c.strip() for c in r.headers.get("transfer-encoding", "").split(",")
                   if c.strip() and c.strip().lower() != "chunked"]
        encoding = ", ".join(filter(None, [r.headers.get("content-encoding", ""), *codings]))
        strict = self._credential_host(flow)
        unknown = ""
        try:
            if encoding.strip() and not length and not streaming and not codings:
                from mitmproxy.net.encoding import encode
                scrub: echo.Gather | echo.Stream = echo.Gather(echoes, encoding, BODY_CAP, encode, strict)
            else:
                scrub = echo.Stream(echoes, encoding, framed=bool(length), strict=strict)
        except ValueError as e:  # an encoding the gate cannot read: its bytes as they are,
            scrub = echo.Stream(echoes, "", framed=True)    # unchanged in length (not on a
            unknown = str(e) if strict else ""              # credential's host: cut off)
        before = r.stream

        def stream(chunk: bytes):
            try:
                if unknown:
                    raise echo.Unreadable(unknown)
                out = scrub.feed(chunk) if chunk else scrub.end()
            except (echo.Echo, Exception) as e:     # a stream that will not decode is cut too
                name = e.name if isinstance(e, echo.Echo) else None
                raise bodies.Cut(self._withheld(flow, name, str(e) or type(e).__name__)) from e
            if scrub.names:
                self._echoed(flow, scrub.names)
            if callable(before):
                out = before(out)
            return out if out or not chunk else []    # an empty chunk would end a chunked body
        r.stream = stream

    def _on_body(self, flow, echoes) -> None:
        """A buffered response body, before its request is recorded: decoded (a bounded
        Content-Encoding), every real value in it put back as its placeholder, encoded again
        (mitmproxy fixes Content-Length); withheld whole if one is left that cannot be."""
        r = flow.response
        raw = r.raw_content
        if not raw:
            return
        encoding = r.headers.get("content-encoding", "")
        body, whole, err = bodies.decode(raw, encoding, True)
        if err or not whole:            # not readable within the bound: decoded piece by piece
            strict = self._credential_host(flow)
            try:
                watch = echo.Stream(echoes, encoding, strict=strict)
                watch.feed(raw)
                watch.end()             # strict: raises if the body did not decode to its end
                left = None
            except echo.Echo as e:
                left = e.name
            except Exception as e:
                if strict:              # the step's client may read what the gate could not
                    self._withhold(flow, None, err or str(e) or type(e).__name__)
                    return
                left = echoes.found(raw)    # it does not decode (nor can the step's client): as it is
            if left is not None:
                self._withhold(flow, left)
            return
        clean, names, left = echoes.scrub(body, self._credential_host(flow))
        if left is not None:
            self._withhold(flow, left)
            return
        if names:
            r.content = clean           # mitmproxy encodes it again and fixes Content-Length
            self._echoed(flow, names)

    def _echoed(self, flow, names) -> None:
        rec = flow.metadata.get(RECORD)
        if rec is not None:
            rec["credential_echo"] = ",".join(sorted(set(names)))

    def _withheld(self, flow, name, why="") -> str:
        """Record a response withheld (cut off) for the real value of credential `name` it
        carried; the text the step's client is given."""
        host, port = target(flow)
        what = f"the real value of credential '{name}'" if name else \
            f"a body the gate could not read ({why})"
        d = network.Decision(
            "deny", RULE, f"the response from {hostnames.norm_host(host)}:{port} carried {what}; "
            "it was withheld from the step (cut off), never passed on", kind=ECHO,
            hint="the server printed the credential it was sent; the step gets placeholders only"
            if name else "on a credential's host the gate passes only bodies it can read whole "
            "(gzip, deflate, br, zstd, identity); ask the server for one of those")
        rec = flow.metadata.get(RECORD)
        if rec is not None:
            rec.update(decision="deny", rule=RULE, reason=d.reason, kind=ECHO,
                       irreversible=False, **({"credential": name} if name else {}))
            self.known.scrub(self.gate.policy(), rec)
        return denial_text(flow, d)

    def _withhold(self, flow, name, why="") -> None:
        """A buffered response that carries a real value the gate cannot rewrite (or, `name`
        None, a credential host's body it cannot read: `why`): replaced whole by a 502 saying so."""
        text = self._withheld(flow, name, why)
        flow.response = http.Response.make(502, text, {"Content-Type": "text/plain; charset=utf-8",
                                                       "X-Envgit-Rule": RULE})

    def _credential_host(self, flow) -> bool:
        """Is the response from one of a credential's hosts (any port its entry names)?"""
        return self.known.on_a_credential_host(self.gate.policy(), *target(flow))

    def websocket_message(self, flow: http.HTTPFlow):
        """A WebSocket message from the server (where network.l7 says `websocket: allow`),
        before it is relayed: real values go back as placeholders; a message holding one that
        cannot be is dropped and recorded. The step's messages: credentials.py."""
        policy = self.gate.policy()
        if flow.websocket is None or not getattr(policy, "credentials", None):
            return
        msg = flow.websocket.messages[-1]
        if msg.from_client:
            return
        echoes = self.known.echoes(policy)
        if not echoes:
            return
        clean, names, left = echoes.scrub(msg.content)
        if left is not None:
            msg.drop()
            host, port = target(flow)
            websocket_denial(self.gate, flow, network.Decision(
                "deny", RULE, f"a WebSocket message from {hostnames.norm_host(host)}:{port} carried "
                f"the real value of credential '{left}'; it was dropped, never passed on",
                kind=ECHO), left)
        elif names:
            msg.content = clean

    def error(self, flow: http.HTTPFlow):
        """mitmproxy answers the step itself with an error's text (a 502 quoting a response
        head it could not parse, with the token the server echoed in it): a flow whose error
        holds a real value is killed, and the step gets the connection's close instead. (Its
        record, made by Record before this, is scrubbed by Gate.emit.)"""
        policy = self.gate.policy()
        msg = flow.error.msg if flow.error else "error"
        if getattr(policy, "credentials", None) and flow.killable and \
                self.known.found_real(policy, [msg]):
            flow.kill()
