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

Real values live in credentials.source.Sources, read on first need; they are never put in a
record, a log line or an error message.
"""

import base64
import binascii
import time
from urllib.parse import quote, unquote

from mitmproxy import http

from ..credentials.placeholder import SESSION, kind_of
from ..credentials.source import CredentialError, Sources, require_botocore
from ..policy import network, urlpath
from ..policy.network import url_glob
from .addon import EnvgitAddon, deny_response

RULE = "credential-misuse"


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


def _basic(value: str) -> str | None:
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(token.strip(), validate=True).decode("latin-1")
    except (binascii.Error, ValueError):
        return None


class CredentialSwap:
    """One gate's credentials: placeholders watched on every intercepted request, real values
    swapped in on allowed requests to a credential's hosts."""

    def __init__(self, gate, sources: Sources | None = None):
        self.gate = gate
        self.sources = sources or Sources()
        self._made = None

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
        for _, v in r.headers.fields:
            value = v.decode("latin-1")
            texts.append(value)
            decoded = _basic(value)
            if decoded is not None:
                texts.append(decoded)
        return texts

    @staticmethod
    def _target(flow, conn) -> tuple[str, int]:
        if conn is not None and conn.connect is not None:
            return conn.connect
        return flow.request.host, flow.request.port

    @staticmethod
    def _covers(cred, scheme, host, port, method, path) -> bool:
        """Is this request one the credential may go on? Only over TLS (the real value never
        crosses the network in the clear), to one of its hosts, and within its methods and
        paths: a path on every reading a server may give it (policy/urlpath.py), as l7 does."""
        if scheme != "https" or not any(network.entry_matches(e, host, port) for e in cred["hosts"]):
            return False
        methods = {m.upper() for m in cred.get("methods") or ["*"]}
        if "*" not in methods and method.upper() not in methods:
            return False
        if cred.get("paths"):
            readings = urlpath.readings(path.partition("?")[0])
            return not readings.doubt and all(any(url_glob(p).fullmatch(s) for p in cred["paths"])
                                              for s in readings.spellings)
        return True

    def _found(self, policy, texts) -> list[str]:
        return [name for name, (_, phs) in self._placeholders(policy).items()
                if any(ph in t for ph in phs for t in texts)]

    def _misuse(self, policy, flow, names) -> str | None:
        """The first credential found on a request it does not cover, or None."""
        conn = self.gate.addon.conns.get(flow.client_conn.id)
        host, port = self._target(flow, conn)
        for name in names:
            cred = policy.credentials.get(name)
            if cred is None or not self._covers(cred, flow.request.scheme, host, port,
                                                flow.request.method, flow.request.path):
                return name
        return None

    def _deny(self, flow, name, rec=None) -> None:
        conn = self.gate.addon.conns.get(flow.client_conn.id)
        host, port = self._target(flow, conn)
        d = network.Decision(
            "deny", RULE, f"the placeholder of credential '{name}' was sent to "
            f"{network.norm_host(host)}:{port} ({flow.request.method}), which the credential "
            "does not cover (its hosts, methods and paths, over https only); nothing was "
            "swapped or sent",
            hint=f"credentials.{name}.hosts (and methods/paths) in envgit.yaml say where it may go")
        flow.response = deny_response(flow, d)
        flow.metadata["envgit.answered"] = True
        fields = {"decision": "deny", "rule": RULE, "reason": d.reason, "kind": "credential",
                  "credential": name, "irreversible": False}
        if rec is not None:                 # judged already: its record says the denial
            rec.update(fields)
            return
        flow.metadata["envgit.judged"] = True
        out = EnvgitAddon._record(flow, d, host=network.norm_host(host), port=port,
                                  status=403, duration_ms=0)
        out.update(fields)
        self.gate.emit(flow.metadata.get("envgit.step"), out)

    # --- events --------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow):
        policy = self.gate.policy()
        if flow.response is not None or not getattr(policy, "credentials", None):
            return
        started = time.perf_counter()
        names = self._found(policy, self._texts(flow))
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
        if body:
            in_body = [n for n in self._found(policy, [body.decode("latin-1")]) if n not in names]
            bad = self._misuse(policy, flow, in_body) if in_body else None
            if bad is not None and (flow.response is None or rec is not None):
                self._deny(flow, bad, rec)
                return
        if flow.response is not None or not names:
            return                          # denied by the policy: sent nowhere, nothing swapped
        flow.metadata["envgit.swapped"] = True
        started = time.perf_counter()
        for name in names:
            cred = policy.credentials.get(name)
            if cred is None:                # dropped from the policy while this request was judged
                continue
            try:
                real = self.sources.value(name, cred["from"])
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
                    value = value.split(" ", 1)[0] + " " + base64.b64encode(
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
