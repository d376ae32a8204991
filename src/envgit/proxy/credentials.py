"""The gate's credential swap: a mitmproxy addon registered after EnvgitAddon.

- `requestheaders`: every placeholder of the session (credentials/placeholder.py) is looked
  for wherever a client puts a token: any header value (Authorization Bearer/token, custom
  headers), Basic credentials (base64 of user:password, as git and npm send them), the path
  and query (raw and percent-decoded). A placeholder on a request its credential does not
  cover (host not in `hosts`, method or path outside its narrowing) is denied there, before
  anything leaves, recorded with rule `credential-misuse` (the step is marked), and nothing is
  swapped. An approval cannot change this: it is judged before and apart from every ask.
- `request` (after EnvgitAddon has judged the request): the body, if buffered whole, is
  looked at the same way; then, on a request the policy allowed, the real value replaces the
  placeholder where clients send a token (`_swap`: never in a body or inside other text, which
  a server may store or echo back), and the record says `credential: NAME`. A request the
  policy denied keeps its placeholder (and is not sent anyway).

- `responseheaders` / the body / `response`'s trailers: proxy/answers.py (mixed in): real
  values go back to the step as placeholders; what cannot be rewritten, or (on a credential's
  host) read whole, is withheld.
- `websocket_message`: a message is judged like a body, both ways.

With any credential in the policy every HTTPS host is intercepted (network.needs_interception):
no tunnel carries a placeholder out unseen.

Real values live in credentials.source.Sources, read on first need (a variable, file or AWS
profile as soon as a response may carry it); they are never put in a record, a log line or an
error message.
"""

import base64
import binascii
import re
import time
from urllib.parse import quote, unquote, unquote_plus

from mitmproxy import http

from ..credentials import echo
from ..credentials.placeholder import SESSION, kind_of
from ..credentials.source import CredentialError, Sources, require_botocore
from ..policy import acts, hostnames, network, urlpath
from ..policy.netrequest import BODY_CAP
from ..policy.netrules import url_glob
from . import bodies
from .addon import EnvgitAddon, _denial_text, as_request, deny_response
from .answers import ECHO, RULE, Answers

MIN_REAL = 8            # a real value shorter than this is not looked for (it would be everywhere)
EAGER = ("env", "file", "profile")  # sources read as soon as a response may carry their value
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



def _path_glob(pattern: str) -> re.Pattern:
    """A credential's `paths` entry: the request rules' URL glob, but exact about case. A
    narrowing allows, so it must not admit another spelling a case-sensitive server (S3 keys,
    git hosts' repositories, Artifactory) reads as another resource."""
    return re.compile(url_glob(pattern).pattern)


class CredentialSwap(Answers):
    """One gate's credentials: placeholders watched on every intercepted request, real values
    swapped in on allowed requests to a credential's hosts."""

    def __init__(self, gate, sources: Sources | None = None):
        self.gate = gate
        self.sources = sources if sources is not None else Sources()
        self._made: tuple[object, dict[str, tuple[dict, list[str]]]] | None = None
        self._reals_made: tuple[object, int, dict[str, list[tuple[str, str]]]] | None = None
        self._echoes_made: tuple[dict, echo.Echoes] | None = None

    # --- what a request carries ----------------------------------------------------------

    def _placeholders(self, policy) -> dict[str, tuple[dict, list[str]]]:
        """name -> (its credential, its placeholder strings); made once per policy object."""
        if self._made is None or self._made[0] is not policy:
            out = {}
            for name, cred in getattr(policy, "credentials", {}).items():
                out[name] = (cred, list(SESSION.of(name, cred).values()))
            self._made = (policy, out)
        return self._made[1]

    @staticmethod
    def _texts(flow: http.HTTPFlow) -> list[str]:
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

    @staticmethod
    def _readings(raw: bytes, encoding: str = "") -> list[str]:
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

    @staticmethod
    def _body_texts(flow: http.HTTPFlow) -> list[str]:
        """A buffered body as a server may read it: as sent, decoded as its Content-Encoding
        says (stacked too; bounded), percent-decoded (a form), JSON `\\u` escapes undone,
        its long base64 runs decoded (a multipart part, a JSON field); and the request's
        trailers, which a server reads as headers."""
        r = flow.request
        texts = CredentialSwap._readings(r.raw_content or b"", r.headers.get("content-encoding", ""))
        for k, v in (r.trailers.fields if r.trailers else ()):
            value = v.decode("latin-1")
            texts += (k.decode("latin-1"), value)
            decoded = _basic(value)
            if decoded is not None:
                texts.append(decoded)
            texts += _decodings(value)
        return texts

    @staticmethod
    def _target(flow, conn) -> tuple[str, int]:
        if conn is not None and conn.connect is not None:
            return conn.connect
        return flow.request.host, flow.request.port

    @staticmethod
    def _covers(cred, scheme, host, port, methods, path) -> bool:
        """Is this request one the credential may go on? Only over TLS (the real value never
        crosses the network in the clear), to one of its hosts, and within its methods (every
        method the server may read: `methods`) and paths: a path on every reading a server may
        give it (policy/urlpath.py), as l7 does, compared exactly (case too: _path_glob)."""
        if scheme != "https" or not any(hostnames.entry_matches(e, host, port) for e in cred["hosts"]):
            return False
        allowed = {m.upper() for m in cred.get("methods") or ["*"]}
        if "*" not in allowed and not methods <= allowed:
            return False
        if cred.get("paths"):
            globs = [_path_glob(p) for p in cred["paths"]]
            readings = urlpath.readings(path.partition("?")[0])
            return not readings.doubt and all(any(g.fullmatch(s) for g in globs)
                                              for s in readings.spellings)
        return True

    def _found(self, policy, texts) -> list[str]:
        blob = "\0".join(texts)            # one search per needle (none holds a NUL)
        return [name for name, (_, phs) in self._placeholders(policy).items()
                if any(ph in blob for ph in phs)]

    def _reals(self, policy) -> dict[str, list[tuple[str, str]]]:
        """name -> [(real value, its placeholder)] of every credential whose real value the
        gate knows: read already (and so maybe handed out: a server can echo it back into
        the step), or cheap and harmless to read now (EAGER: a variable, a file, an AWS
        profile; a server may know the value without the gate handing it out). A `command:`
        source is run only when a request needs its value. Made again only when the policy or
        the set of values read changes."""
        made = self._reals_made
        if made is not None and made[0] is policy and made[1] == len(self.sources):
            return made[2]
        out = {}
        for name, (cred, _) in self._placeholders(policy).items():
            real = self.sources.resolved(name, cred["from"])
            if real is None and next(iter(cred["from"])) in EAGER:
                try:
                    real = self.sources.value(name, cred["from"], policy)
                except CredentialError:
                    real = None             # said by `envgit doctor` and on the request needing it
            if real:
                ph = SESSION.of(name, cred)
                pairs = [(v, ph[k]) for k, v in real.items() if k in ph and len(v) >= MIN_REAL]
                if pairs:
                    out[name] = pairs
        self._reals_made = (policy, len(self.sources), out)
        return out

    def _echoes(self, policy) -> echo.Echoes:
        """The real values' forms in a body (credentials/echo.py), made once per _reals."""
        reals = self._reals(policy)
        if self._echoes_made is None or self._echoes_made[0] is not reals:
            self._echoes_made = (reals, echo.Echoes(
                [(name, real, ph) for name, pairs in reals.items() for real, ph in pairs]))
        return self._echoes_made[1]

    def _found_real(self, policy, texts) -> list[str]:
        reals = self._reals(policy)
        if not reals:
            return []
        blob = "\0".join(texts)
        return [name for name, pairs in reals.items() if any(real in blob for real, _ in pairs)]

    def _misuse(self, policy, flow, names) -> str | None:
        """The first credential found on a request it does not cover, or None. Judged on
        every method and path a server may act on (policy/acts.py, the one reader the request
        rules use too): a credential narrowed to methods or paths goes on none other."""
        conn = self.gate.addon.conns.get(flow.client_conn.id)
        host, port = self._target(flow, conn)
        req = as_request(flow, conn)          # the body too once it is there (request())
        methods, paths = acts.methods(req), acts.paths(req)
        for name in names:
            cred = policy.credentials.get(name)
            if cred is None or not all(self._covers(cred, flow.request.scheme, host, port, methods, p)
                                       for p in paths):
                return name
        return None

    def _decision(self, flow, name, what="placeholder") -> network.Decision:
        conn = self.gate.addon.conns.get(flow.client_conn.id)
        host, port = self._target(flow, conn)
        return network.Decision(
            "deny", RULE, f"the {what} of credential '{name}' was sent to "
            f"{hostnames.norm_host(host)}:{port} ({flow.request.method}), which the credential "
            "does not cover (its hosts, methods and paths, over https only); nothing was "
            "swapped or sent",
            hint=f"credentials.{name}.hosts (and methods/paths) in envgit.yaml say where it may go")

    def _deny(self, flow, name, rec=None, what="placeholder") -> None:
        conn = self.gate.addon.conns.get(flow.client_conn.id)
        host, port = self._target(flow, conn)
        d = self._decision(flow, name, what)
        flow.response = deny_response(flow, d)
        flow.metadata["envgit.answered"] = True
        fields = {"decision": "deny", "rule": RULE, "reason": d.reason, "kind": "credential",
                  "credential": name, "irreversible": False}
        if rec is not None:                 # judged already: its record says the denial
            rec.update(fields)
            self._scrub(rec)
            return
        flow.metadata["envgit.judged"] = True
        out = EnvgitAddon._record(flow, d, host=hostnames.norm_host(host), port=port,
                                  status=403, duration_ms=0)
        out.update(fields)
        self.gate.emit(flow.metadata.get("envgit.step"), self._scrub(out))

    def _scrub(self, rec: dict) -> dict:
        """A record of a request that carried a real value (in its path, say) names the
        credential instead: real values never reach the journal."""
        reals = self._reals(self.gate.policy())
        for key, v in rec.items():
            if isinstance(v, str):
                for name, pairs in reals.items():
                    for real, _ in pairs:
                        for r in (real, quote(real, safe="")):
                            v = v.replace(r, f"<credential {name}>")
                rec[key] = v
        return rec

    # --- events --------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow):
        policy = self.gate.policy()
        if flow.response is not None or not getattr(policy, "credentials", None):
            return
        started = time.perf_counter()
        texts = self._texts(flow)
        # a real value the gate handed out, echoed back by a server and sent on by the step
        real = self._found_real(policy, texts)
        bad = self._misuse(policy, flow, real) if real else None
        if bad is not None:
            self._deny(flow, bad, what="real value")
            return
        names = self._found(policy, texts)
        if not names:
            return
        bad = self._misuse(policy, flow, names)
        if bad is not None:
            self._deny(flow, bad)
            return
        flow.metadata["envgit.credentials"] = names
        flow.metadata["envgit.looked_s"] = time.perf_counter() - started

    def request(self, flow: http.HTTPFlow):
        policy = self.gate.policy()
        if flow.metadata.get("envgit.swapped") or not getattr(policy, "credentials", None):
            return
        rec = flow.metadata.get("envgit.record")
        names = list(flow.metadata.get("envgit.credentials", []))
        body = flow.request.raw_content
        if body or flow.request.trailers:
            text = self._body_texts(flow)
            for what, found in (("real value", self._found_real(policy, text)),
                                ("placeholder", self._found(policy, text))):
                in_body = [n for n in found if n not in names]
                bad = self._misuse(policy, flow, in_body) if in_body else None
                if bad is not None and (flow.response is None or rec is not None):
                    self._deny(flow, bad, rec, what)
                    return
        if names and body and (flow.response is None or rec is not None):
            bad = self._misuse(policy, flow, names)    # a body's `_method` field (acts.py)
            if bad is not None:
                self._deny(flow, bad, rec)
                return
        if flow.response is None and flow.metadata.get(bodies.PARTIAL):
            self._watch_rest(policy, flow, rec)
        if flow.response is None:
            self._whole_answers(policy, flow)
        if flow.response is not None or not names:
            return                          # denied by the policy: sent nowhere, nothing swapped
        flow.metadata["envgit.swapped"] = True
        started = time.perf_counter()
        for name in names:
            cred = policy.credentials.get(name)
            if cred is None:                # dropped from the policy while this request was judged
                continue
            try:
                real = self.sources.value(name, cred["from"], policy)
                if kind_of(name, cred) == "aws":
                    require_botocore()
            except CredentialError as e:
                d = network.Decision("deny", "credential-unavailable", str(e),
                                     hint="`envgit doctor` checks every credential's source")
                flow.response = deny_response(flow, d)
                flow.metadata["envgit.answered"] = True
                if rec is not None:
                    rec.update(decision="deny", rule=d.rule, reason=d.reason, credential=name)
                return
            if kind_of(name, cred) == "aws":
                self._resign(flow, SESSION.of(name, cred), real)
            else:
                self._swap(flow, SESSION.of(name, cred)["token"], real["token"])
        if rec is not None:
            rec["credential"] = ",".join(names)
            # what the credential work cost this request: finding and checking the
            # placeholder (requestheaders) and the swap (bench/bench_credentials.py reads it)
            rec["swap_us"] = round((time.perf_counter() - started +
                                    flow.metadata.get("envgit.looked_s", 0)) * 1e6, 1)

    def _whole_answers(self, policy, flow) -> None:
        """A request to a host of a token credential goes without `Range`/`If-Range`, with a
        token swapped in or not: byte ranges of an answer that holds the token (an echo, a
        log the server kept of what it was sent) would hand the step fragments no rewrite
        recognises. AWS keeps its ranges: its secret never travels, and SigV4 signs them."""
        if not any(h in flow.request.headers for h in RANGE_HEADERS):
            return
        conn = self.gate.addon.conns.get(flow.client_conn.id)
        host, port = self._target(flow, conn)
        for name, (cred, _) in self._placeholders(policy).items():
            if kind_of(name, cred) != "aws" and \
                    any(hostnames.entry_matches(e, host, port) for e in cred["hosts"]):
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
        phs = [(name, ph, ph) for name, (_, values) in self._placeholders(policy).items()
               for ph in values if self._misuse(policy, flow, [name]) is not None]
        reals = [(name, real, ph) for name, pairs in self._reals(policy).items()
                 for real, ph in pairs if self._misuse(policy, flow, [name]) is not None]
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
        before = flow.metadata.get(bodies.CUT)

        def cut(chunk: bytes) -> str:  # the buffered part comes first (bodies.py), then the rest
            for what, watch in watches:
                try:
                    watch.feed(chunk)
                except echo.Echo as e:
                    return self._cut_request(flow, rec, e.name, what)
                except Exception:   # it stops decoding here: a server cannot read on either
                    watches.remove((what, watch))
            return before(chunk) if before is not None else ""
        flow.metadata[bodies.CUT] = cut

    def _cut_request(self, flow, rec, name, what) -> str:
        d = self._decision(flow, name, what)
        if rec is not None:
            rec.update(decision="deny", rule=RULE, reason=d.reason, kind="credential",
                       credential=name, irreversible=False)
            self._scrub(rec)
        return _denial_text(flow, d)

    def websocket_message(self, flow: http.HTTPFlow):
        """A WebSocket (where network.l7 says `websocket: allow`): each whole message, before
        it is relayed. From the step: a placeholder or real value of a credential that does
        not cover the connection's host (and upgrade request) is dropped, never sent, and
        recorded as misuse (a message never gets a real value swapped in). From the server:
        real values go back as placeholders; a message holding one that cannot be is dropped
        and recorded."""
        policy = self.gate.policy()
        if flow.websocket is None or not getattr(policy, "credentials", None):
            return
        msg = flow.websocket.messages[-1]
        if msg.from_client:
            texts = self._readings(msg.content)
            for what, names in (("real value", self._found_real(policy, texts)),
                                ("placeholder", self._found(policy, texts))):
                bad = self._misuse(policy, flow, names) if names else None
                if bad is not None:
                    msg.drop()
                    self._message_record(flow, self._decision(flow, bad, what), bad)
                    return
            return
        echoes = self._echoes(policy)
        if not echoes:
            return
        clean, names, left = echoes.scrub(msg.content)
        if left is not None:
            msg.drop()
            conn = self.gate.addon.conns.get(flow.client_conn.id)
            host, port = self._target(flow, conn)
            self._message_record(flow, network.Decision(
                "deny", RULE, f"a WebSocket message from {hostnames.norm_host(host)}:{port} carried "
                f"the real value of credential '{left}'; it was dropped, never passed on",
                kind=ECHO), left)
        elif names:
            msg.content = clean

    def _message_record(self, flow, d: network.Decision, name: str) -> None:
        conn = self.gate.addon.conns.get(flow.client_conn.id)
        host, port = self._target(flow, conn)
        rec = EnvgitAddon._record(flow, d, host=hostnames.norm_host(host), port=port,
                                  status=101, duration_ms=0)
        rec.update(decision="deny", rule=RULE, kind=d.kind or "credential", credential=name,
                   reason=d.reason + " (a WebSocket message)", irreversible=False)
        self.gate.emit(flow.metadata.get("envgit.step"), self._scrub(rec))

    # --- swapping --------------------------------------------------------------------------

    @staticmethod
    def _swap(flow, placeholder: str, real: str) -> None:
        """The real value where a client sends a token, and only there: a header whose value
        is the placeholder, or in an auth header `<scheme> <placeholder>` (Bearer, token, …); Basic credentials
        whose user or password is it; a token-named query parameter (TOKEN_PARAMS) whose
        value is it. Never in a body or inside other text (a search query, a gist, a
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

    @staticmethod
    def _resign(flow, placeholder: dict, real: dict) -> None:
        from .sigv4 import resign
        resign(flow.request, placeholder, real)
