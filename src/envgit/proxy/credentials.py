"""The credential swap: the addon that puts a credential's real value where a step sent its
placeholder, on requests the credential covers (policy/credcover.py) and the policy allowed.
Runs after the judge (flowstate.py gives the order); the answers' side is echoguard.py.

- `requestheaders`: every placeholder of the session (credentials/placeholder.py) is looked
  for wherever a client puts a token: any header value (Authorization Bearer/token, custom
  headers), Basic credentials (base64 of user:password, as git and npm send them), the path
  and query (raw and percent-decoded). A placeholder on a request its credential does not
  cover (host not in `hosts`, method or path outside its narrowing) is denied there, before
  anything leaves, recorded with rule `credential-misuse` (the step is marked), and nothing is
  swapped. An approval cannot change this: it is judged before and apart from every ask.
- `request` (after the judge): the body, if buffered whole, is looked at the same way; then,
  on a request the policy allowed, the real value replaces the placeholder where clients send
  a token (`_swap`: never in a body or inside other text, which a server may store or echo
  back), and the record says `credential: NAME`. A request the policy denied keeps its
  placeholder (and is not sent anyway).
- `websocket_message` from the step: judged like a body.

With any credential in the policy every HTTPS host is intercepted (network.needs_interception):
no tunnel carries a placeholder out unseen.
"""

import base64
import binascii
import re
import time
from urllib.parse import quote, unquote, unquote_plus

from mitmproxy import http

from ..credentials import echo
from ..credentials.placeholder import SESSION, kind_of
from ..credentials.source import CredentialError, require_botocore
from ..policy import credcover, hostnames, network
from ..policy.credcover import RULE
from ..policy.netrequest import BODY_CAP
from . import record
from .flows import as_request, denial_text, deny_response, target
from .flowstate import ANSWERED, CREDENTIALS, CUT, JUDGED, LOOKED_S, PARTIAL, RECORD, STEP, SWAPPED

RANGE_HEADERS = ("range", "if-range")   # dropped on a token credential's hosts (_whole_answers)


TOKEN_PARAMS = {"access_token", "token", "private_token", "api_key", "apikey", "key", "auth",
                "auth_token", "client_secret", "password", "secret"}


def _token_param(name: str) -> bool:
    n = name.lower().replace("-", "_")
    return n in TOKEN_PARAMS or n.endswith(("_token", "_key", "_secret"))


def _auth_header(name: bytes) -> bool:
    """Authorization, and custom headers named for auth or a token (X-Auth-Token, …): where
    `<scheme> <token>` is sent."""
    n = name.decode("latin-1").lower()
    return "auth" in n or "token" in n


def _b64(token: str) -> str | None:
    """`token` decoded as leniently as servers decode base64 (Node's Buffer, most Basic-auth
    middlewares): padding optional, the URL-safe alphabet too, other characters skipped."""
    t = token.replace("-", "+").replace("_", "/").rstrip("=")
    if len(t) % 4 == 1:
        t = t[:-1]                          # a dangling character carries no whole byte
    try:
        return base64.b64decode(t + "=" * (-len(t) % 4)).decode("latin-1")
    except (binascii.Error, ValueError):
        return None


def _basic(value: str) -> str | None:
    """Basic credentials as a server reads them: the scheme in any case, any whitespace, the
    base64 lenient (_b64); None when the value is not Basic."""
    parts = value.split(None, 1)
    if len(parts) != 2 or parts[0].lower() != "basic":
        return None
    return _b64("".join(parts[1].split()))


# Runs of base64 characters long enough to hold a placeholder's half: a token a client (or a
# server's own scheme) may carry base64-encoded anywhere, not only after `Basic`.
_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")


def _decodings(text: str) -> list[str]:
    return [d for d in map(_b64, _B64_RUN.findall(text)) if d]


def texts_of(flow: http.HTTPFlow) -> list[str]:
    """Where a client may put a token, as the server would read it."""
    r = flow.request
    texts = [r.path, unquote(r.path), unquote(unquote(r.path))]
    texts += _decodings(texts[1])
    for k, v in r.headers.fields:
        value = v.decode("latin-1")
        texts += (k.decode("latin-1"), value)   # a header's name is sent as the step spelled it
        decoded = _basic(value)
        if decoded is not None:
            texts.append(decoded)
        texts += _decodings(value)
        if "%" in value:                        # cookies and custom headers, percent-decoded
            texts.append(unquote(value))        # by the frameworks that read them
    return texts


def readings(raw: bytes, encoding: str = "") -> list[str]:
    """A body (or a WebSocket message) as a server may read it: as sent, decoded as its
    Content-Encoding says (stacked too; bounded), percent-decoded (a form), JSON `\\u`
    escapes undone, its long base64 runs decoded (a multipart part, a JSON field)."""
    texts = [raw.decode("latin-1")] if raw else []
    if raw and encoding.strip():
        decoded = echo.decoded(raw, encoding, BODY_CAP)
        if decoded is not None:
            texts.append(decoded.decode("latin-1"))
    for t in list(texts):
        if "%" in t or "+" in t:
            texts.append(unquote_plus(t))
        if "\\u" in t:
            texts.append(echo.unescape_u(t))
        texts += _decodings(t)
    return texts


def body_texts(flow: http.HTTPFlow) -> list[str]:
    """A buffered body as a server may read it (readings), and the request's trailers, which
    a server reads as headers."""
    r = flow.request
    texts = readings(r.raw_content or b"", r.headers.get("content-encoding", ""))
    for k, v in (r.trailers.fields if r.trailers else ()):
        value = v.decode("latin-1")
        texts += (k.decode("latin-1"), value)
        decoded = _basic(value)
        if decoded is not None:
            texts.append(decoded)
        texts += _decodings(value)
    return texts


def misuse_decision(flow: http.HTTPFlow, name: str, what: str = "placeholder") -> network.Decision:
    return credcover.misuse(name, what, *target(flow), flow.request.method)


def websocket_denial(gate, flow: http.HTTPFlow, d: network.Decision, name: str) -> None:
    """Record a WebSocket message dropped for credential `name` (either way)."""
    host, port = target(flow)
    rec = record.make(flow, d, host=hostnames.norm_host(host), port=port, status=101, duration_ms=0)
    rec.update(decision="deny", rule=RULE, kind=d.kind or "credential", credential=name,
               reason=d.reason + " (a WebSocket message)", irreversible=False)
    gate.emit(flow.metadata.get(STEP), gate.credentials.scrub(gate.policy(), rec))


class CredentialSwap:
    """One gate's requests with credentials: placeholders watched on every intercepted
    request, real values swapped in on allowed requests to a credential's hosts. `gate`
    supplies the policy, the credentials (credvalues.CredentialValues) and the journal."""

    def __init__(self, gate):
        self.gate = gate
        self.known = gate.credentials

    def _uncovered(self, policy, flow, names) -> str | None:
        """The first credential found on a request it does not cover, or None (the request as
        read now: its body too, once buffered)."""
        return credcover.uncovered(policy.credentials, names, as_request(flow))

    def _deny(self, flow, name, rec=None, what="placeholder") -> None:
        host, port = target(flow)
        d = misuse_decision(flow, name, what)
        flow.response = deny_response(flow, d)
        flow.metadata[ANSWERED] = True
        fields = {"decision": "deny", "rule": RULE, "reason": d.reason, "kind": "credential",
                  "credential": name, "irreversible": False}
        if rec is not None:                 # judged already: its record says the denial
            rec.update(fields)
            self.known.scrub(self.gate.policy(), rec)
            return
        flow.metadata[JUDGED] = True
        out = record.make(flow, d, host=hostnames.norm_host(host), port=port, status=403, duration_ms=0)
        out.update(fields)
        self.gate.emit(flow.metadata.get(STEP), self.known.scrub(self.gate.policy(), out))

    # --- events --------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow):
        policy = self.gate.policy()
        if flow.response is not None or not getattr(policy, "credentials", None):
            return
        started = time.perf_counter()
        texts = texts_of(flow)
        # a real value the gate handed out, echoed back by a server and sent on by the step
        real = self.known.found_real(policy, texts)
        bad = self._uncovered(policy, flow, real) if real else None
        if bad is not None:
            self._deny(flow, bad, what="real value")
            return
        names = self.known.found(policy, texts)
        if not names:
            return
        bad = self._uncovered(policy, flow, names)
        if bad is not None:
            self._deny(flow, bad)
            return
        flow.metadata[CREDENTIALS] = names
        flow.metadata[LOOKED_S] = time.perf_counter() - started

    def request(self, flow: http.HTTPFlow):
        policy = self.gate.policy()
        if flow.metadata.get(SWAPPED) or not getattr(policy, "credentials", None):
            return
        rec = flow.metadata.get(RECORD)
        names = list(flow.metadata.get(CREDENTIALS, []))
        body = flow.request.raw_content
        if body or flow.request.trailers:
            text = body_texts(flow)
            for what, found in (("real value", self.known.found_real(policy, text)),
                                ("placeholder", self.known.found(policy, text))):
                in_body = [n for n in found if n not in names]
                bad = self._uncovered(policy, flow, in_body) if in_body else None
                if bad is not None and (flow.response is None or rec is not None):
                    self._deny(flow, bad, rec, what)
                    return
        if names and body and (flow.response is None or rec is not None):
            bad = self._uncovered(policy, flow, names)    # a body's `_method` field (acts.py)
            if bad is not None:
                self._deny(flow, bad, rec)
                return
        if flow.response is None and flow.metadata.get(PARTIAL):
            self._watch_rest(policy, flow, rec)
        if flow.response is None:
            self._whole_answers(policy, flow)
        if flow.response is not None or not names:
            return                          # denied by the policy: sent nowhere, nothing swapped
        flow.metadata[SWAPPED] = True
        started = time.perf_counter()
        for name in names:
            cred = policy.credentials.get(name)
            if cred is None:                # dropped from the policy while this request was judged
                continue
            try:
                real = self.known.sources.value(name, cred["from"], policy)
                if kind_of(name, cred) == "aws":
                    require_botocore()
            except CredentialError as e:
                d = network.Decision("deny", "credential-unavailable", str(e),
                                     hint="`envgit doctor` checks every credential's source")
                flow.response = deny_response(flow, d)
                flow.metadata[ANSWERED] = True
                if rec is not None:
                    rec.update(decision="deny", rule=d.rule, reason=d.reason, credential=name)
                return
            if kind_of(name, cred) == "aws":
                from .sigv4 import resign
                resign(flow.request, SESSION.of(name, cred), real)
            else:
                _swap(flow, SESSION.of(name, cred)["token"], real["token"])
        if rec is not None:
            rec["credential"] = ",".join(names)
            # what the credential work cost this request: finding and checking the
            # placeholder (requestheaders) and the swap (bench/bench_credentials.py reads it)
            rec["swap_us"] = round((time.perf_counter() - started +
                                    flow.metadata.get(LOOKED_S, 0)) * 1e6, 1)

    def _whole_answers(self, policy, flow) -> None:
        """A request to a host of a token credential goes without `Range`/`If-Range`, with a
        token swapped in or not: byte ranges of an answer that holds the token (an echo, a
        log the server kept of what it was sent) would hand the step fragments no rewrite
        recognises. AWS keeps its ranges: its secret never travels, and SigV4 signs them."""
        if not any(h in flow.request.headers for h in RANGE_HEADERS):
            return
        host, port = target(flow)
        for name, (cred, _) in self.known.placeholders(policy).items():
            if kind_of(name, cred) != "aws" and credcover.on_its_hosts(cred, host, port):
                for h in RANGE_HEADERS:
                    if h in flow.request.headers:
                        del flow.request.headers[h]
                return

    def _watch_rest(self, policy, flow, rec) -> None:
        """A body larger than the gate buffers is streamed on past its first BODY_CAP bytes
        (bodies.py): each further chunk is looked at before it is sent, decoded as its
        Content-Encoding says, for the placeholder or real value (in the forms a body carries
        them: credentials/echo.py) of every credential that does not cover this request. One
        found: that chunk is not sent, the upstream request is cut off mid-body (the server
        never has it whole), and the request is recorded as credential misuse."""
        phs = [(name, ph, ph) for name, (_, values) in self.known.placeholders(policy).items()
               for ph in values if self._uncovered(policy, flow, [name]) is not None]
        reals = [(name, real, ph) for name, pairs in self.known.reals(policy).items()
                 for real, ph in pairs if self._uncovered(policy, flow, [name]) is not None]
        encoding = flow.request.headers.get("content-encoding", "")
        watches = []
        for what, pairs in (("placeholder", phs), ("real value", reals)):
            if pairs:
                try:
                    watches.append((what, echo.Stream(echo.Echoes(pairs), encoding, rewrite=False)))
                except ValueError:  # an encoding the gate cannot read (nor most servers): as it is
                    watches.append((what, echo.Stream(echo.Echoes(pairs), "", rewrite=False)))
        if not watches:
            return
        before = flow.metadata.get(CUT)

        def cut(chunk: bytes) -> str:  # the buffered part comes first (bodies.py), then the rest
            for what, watch in watches:
                try:
                    watch.feed(chunk)
                except echo.Echo as e:
                    return self._cut_request(flow, rec, e.name, what)
                except Exception:   # it stops decoding here: a server cannot read on either
                    watches.remove((what, watch))
            return before(chunk) if before is not None else ""
        flow.metadata[CUT] = cut

    def _cut_request(self, flow, rec, name, what) -> str:
        d = misuse_decision(flow, name, what)
        if rec is not None:
            rec.update(decision="deny", rule=RULE, reason=d.reason, kind="credential",
                       credential=name, irreversible=False)
            self.known.scrub(self.gate.policy(), rec)
        return denial_text(flow, d)

    def websocket_message(self, flow: http.HTTPFlow):
        """A WebSocket message from the step (where network.l7 says `websocket: allow`), before
        it is relayed: a placeholder or real value of a credential that does not cover the
        connection's host (and upgrade request) is dropped, never sent, and recorded as misuse
        (a message never gets a real value swapped in). The server's: echoguard.py."""
        policy = self.gate.policy()
        if flow.websocket is None or not getattr(policy, "credentials", None):
            return
        msg = flow.websocket.messages[-1]
        if not msg.from_client:
            return
        texts = readings(msg.content)
        for what, names in (("real value", self.known.found_real(policy, texts)),
                            ("placeholder", self.known.found(policy, texts))):
            bad = self._uncovered(policy, flow, names) if names else None
            if bad is not None:
                msg.drop()
                websocket_denial(self.gate, flow, misuse_decision(flow, bad, what), bad)
                return


def _swap(flow, placeholder: str, real: str) -> None:
    """The real value where a client sends a token, and only there: a header whose value is
    the placeholder, or in an auth header `<scheme> <placeholder>` (Bearer, token, …); Basic
    credentials whose user or password is it; a token-named query parameter (TOKEN_PARAMS)
    whose value is it. Never in a body or inside other text (a search query, a gist, a
    cookie): a server may store or echo those back into the sandbox."""
    r = flow.request
    fields = []
    for k, v in r.headers.fields:
        value = v.decode("latin-1")
        decoded = _basic(value)
        if decoded is not None:
            user, colon, password = decoded.partition(":")
            if placeholder in (user, password):
                user = real if user == placeholder else user
                password = real if password == placeholder else password
                value = value.split(None, 1)[0] + " " + base64.b64encode(
                    f"{user}{colon}{password}".encode("latin-1")).decode()
        elif value.strip() == placeholder:
            value = real
        elif _auth_header(k):
            scheme, _, rest = value.strip().partition(" ")
            if rest.strip() == placeholder and scheme.isalnum():
                value = f"{scheme} {real}"
        fields.append((k, value.encode("latin-1")))
    r.headers.fields = tuple(fields)
    base, q, query = r.path.partition("?")
    if q and placeholder in unquote(query):
        items = []
        for item in query.split("&"):
            name, eq, val = item.partition("=")
            if eq and unquote(val) == placeholder and _token_param(unquote(name)):
                item = f"{name}={quote(real, safe='')}"
            items.append(item)
        r.path = base + "?" + "&".join(items)
