"""The mitmproxy addon: turns each connection and request into a question for the policy
(envgit.policy.network), and carries out the answer. Nothing here decides: it authenticates
the step, builds the Request, acts on the Decision, holds asks, and records.

Event order for one client connection:
  http_connect        CONNECT host:port -> judge_connect: 403/407, or tunnel/intercept
  tls_clienthello     tunnelled hosts: passed through untouched (no TLS termination)
  requestheaders      plain-HTTP proxy requests: the step from Proxy-Authorization
  request             the whole (decoded) request -> decide_request: deny / ask / allow
  server_connect(ed)  ENVGIT_RESOLVE names and DNS answers (judged by judge_address)
  responseheaders     the response is streamed, counted on the way
  response / error    the request's record
  client_disconnected the tunnel's record (bytes counted at the socket)

Request bodies are buffered up to netrequest.BODY_CAP before `request` (bodies.py): a larger one
is judged on its first BODY_CAP bytes (a rule that needs more doubts, and matches), then
streamed on if allowed, or read to its end and dropped if denied. Nothing reaches the server
before the request is judged. Responses are streamed (with credentials, a small one is
buffered and looked at first: bodies.ON_BODY, proxy/credentials.py).

An `ask` is asked about one effect (approval.approval_effect), and the answer covers exactly
that effect for the rest of the step; while a person decides, the gate reads nothing more
from that client. An effect that cannot be known (a push whose commands cannot be read, a
GraphQL request whose operations cannot) is denied without asking.
"""

import base64
import binascii
import dataclasses
import logging
import time
from dataclasses import dataclass, field

from mitmproxy import http

from ..policy import acts, hostnames, network
from ..policy.approval import approval_effect, query_digest
from . import bodies, gitproto, upgrade

log = logging.getLogger("envgit.proxy")

_SAFE_QUERY_KEYS = {"service"}               # git's service names are no secret


@dataclass
class Conn:
    """What the gate knows about one client connection."""
    step: int | None = None
    connect: tuple[str, int] | None = None   # the CONNECT target
    tunnelled: bool = False
    started: float = field(default_factory=time.time)
    counter: object = None                    # gate.Counted: the socket's byte counts


def redact_path(path: str) -> str:
    """The path with query values replaced (tokens travel in queries)."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    parts = []
    for item in query.split("&"):
        k, eq, v = item.partition("=")
        parts.append(item if k in _SAFE_QUERY_KEYS or not eq else f"{k}=REDACTED")
    return base + "?" + "&".join(parts)


def _headers(r: http.Request) -> dict[str, str]:
    """Lower-case names; a header sent more than once keeps every value, joined by ", " (so a
    second Content-Type is seen, not dropped)."""
    out: dict[str, str] = {}
    for k, v in r.headers.fields:
        name, value = k.decode("latin-1").lower(), v.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def as_request(flow: http.HTTPFlow, conn: Conn | None) -> network.Request:
    r = flow.request
    headers = _headers(r)
    if r.authority:                          # absolute-form target or HTTP/2 :authority
        headers[":authority"] = r.authority
    body, complete, err = None, True, ""
    if r.raw_content:
        body, complete, err = bodies.decode(r.raw_content, headers.get("content-encoding", ""),
                                            not flow.metadata.get(bodies.PARTIAL))
    # Inside a tunnel mitmproxy sends every request to the tunnel's server, whatever the
    # request names (that is checked against it by the policy); r.host would be the
    # address the gate connected to.
    host, port = conn.connect if conn and conn.connect else (r.host, r.port)
    return network.Request(
        scheme=r.scheme, host=host, port=port, method=r.method, path=r.path.partition("?")[0],
        query=r.path.partition("?")[2], headers=headers, body=body, body_error=err,
        body_complete=complete,
        connect_host=conn.connect[0] if conn and conn.connect else None,
        connect_port=conn.connect[1] if conn and conn.connect else None,
        sni=flow.client_conn.sni)


def _hostport(host, port):
    host = hostnames.norm_host(host)
    return host if port in (80, 443) else f"{host}:{port}"


def _frame_body(r: http.Request) -> None:
    # An HTTP/2 request body has no Content-Length of its own; mitmproxy (12.3.1) sends it to
    # an HTTP/1 server unframed, and the server reads an empty body (seen with git push).
    if r.raw_content and "content-length" not in r.headers and \
            "chunked" not in r.headers.get("transfer-encoding", "").lower():
        r.headers["content-length"] = str(len(r.raw_content))


def _denial_text(flow, d: network.Decision) -> str:
    r = flow.request
    what = f" ({d.kind})" if d.kind else ""
    return (f"envgit: denied {r.method} {r.pretty_host}{redact_path(r.path)}{what} by rule "
            f"{d.rule}\nenvgit: {d.reason}\n" + (f"envgit: {d.hint}\n" if d.hint else ""))


def deny_response(flow: http.HTTPFlow, d: network.Decision, body: bytes | None = None) -> http.Response:
    """403 with the reason; for a push, a receive-pack report rejecting each ref (`body`: the
    decoded request body, as judged)."""
    text = _denial_text(flow, d)
    if d.rule.endswith("git-push") and flow.request.path.partition("?")[0].endswith("git-receive-pack"):
        report = gitproto.rejection(body or b"", f"envgit: {d.reason}", text)
        if report is not None:
            return http.Response.make(200, report, {"Content-Type": gitproto.RESULT_TYPE,
                                                    "Cache-Control": "no-cache",
                                                    "X-Envgit-Rule": d.rule})
    return http.Response.make(403, text, {"Content-Type": "text/plain; charset=utf-8",
                                          "X-Envgit-Rule": d.rule})


def _proxy_auth_required() -> http.Response:
    return http.Response.make(
        407, "envgit: this proxy needs the step's credentials (set by envgit run)\n",
        {"Proxy-Authenticate": 'Basic realm="envgit"', "Content-Type": "text/plain"})


class EnvgitAddon:
    """One gate's event methods. `gate` supplies the policy, the steps, asks and records."""

    def __init__(self, gate):
        self.gate = gate
        self.conns: dict[str, Conn] = {}

    # --- connections ---------------------------------------------------------------------

    def client_connected(self, client):
        self.conns[client.id] = Conn(counter=self.gate.counter_for(client.peername))

    def client_disconnected(self, client):
        conn = self.conns.pop(client.id, None)
        if conn and conn.tunnelled and conn.step is not None:
            c = conn.counter
            self.gate.emit(conn.step, {
                "method": "CONNECT", "scheme": "https", "host": conn.connect[0],
                "port": conn.connect[1], "path": "", "status": 200,
                "bytes_up": getattr(c, "up", None), "bytes_down": getattr(c, "down", None),
                "duration_ms": round((time.time() - conn.started) * 1000, 1),
                "decision": "allow", "rule": "network.allow", "kind": "tunnel",
                "irreversible": False, "intercepted": False, "started_at": conn.started})

    def _authenticate(self, flow) -> int | None:
        value = flow.request.headers.pop("proxy-authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        conn = self.conns.get(flow.client_conn.id)
        return self.gate.step_of(user, password, conn.counter if conn else None)

    def http_connect(self, flow: http.HTTPFlow):
        conn = self.conns.setdefault(flow.client_conn.id, Conn())
        step = self._authenticate(flow)
        if step is None:
            flow.response = _proxy_auth_required()
            return
        host, port = flow.request.host, flow.request.port
        d = network.judge_connect(self.gate.policy(), host, port)
        conn.step, conn.connect, conn.started = step, (host, port), time.time()
        if d.action != "allow":
            flow.response = deny_response(flow, d)
            self.gate.emit(step, self._record(flow, d, status=403, intercepted=False, duration_ms=0))

    def tls_clienthello(self, data):
        conn = self.conns.get(data.context.client.id)
        if conn is None or conn.connect is None:
            return
        sni = data.client_hello.sni
        if not network.needs_interception(self.gate.policy(), *conn.connect, sni=sni):
            data.ignore_connection = True
            conn.tunnelled = True

    async def server_connect(self, data):
        await self.gate.route(data.server)

    def server_connected(self, data):
        self.gate.unroute(data.server)

    def server_connect_error(self, data):
        self.gate.unroute(data.server)

    # --- requests ------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow):
        conn = self.conns.get(flow.client_conn.id)
        if conn is not None and conn.connect is not None:
            flow.request.headers.pop("proxy-authorization", None)   # never forwarded upstream
            flow.metadata["envgit.step"] = conn.step
            return
        step = self._authenticate(flow)                  # plain HTTP: each request says
        if step is None:
            flow.response = _proxy_auth_required()
            return
        flow.metadata["envgit.step"] = step

    async def request(self, flow: http.HTTPFlow):
        if flow.response is not None:                    # answered already (407)
            return
        if flow.metadata.get("envgit.judged"):           # the end of a body streamed on
            return
        flow.metadata["envgit.judged"] = True
        step = flow.metadata.get("envgit.step")
        if not self.gate.step_open(step):
            d = network.Decision("deny", "builtin:step-closed", f"step {step} has ended",
                                 hint="each command runs as its own step; start it again")
            flow.response = deny_response(flow, d)
            return
        started = time.time()
        conn = self.conns.get(flow.client_conn.id)
        req = as_request(flow, conn)
        d = network.decide_request(self.gate.policy(), req)
        effect = approval_effect(d, req) if d.action == "ask" else None
        if effect is not None and effect.doubt:
            d = dataclasses.replace(d, action="deny", reason=f"{d.reason}; {effect.doubt}, so "
                                    "nobody can be asked about it")
        rec = self._record(flow, d, started_at=started, host=req.host, port=req.port)
        flow.metadata["envgit.record"] = rec
        if d.action == "ask":
            question = self._question(step, flow, d, req, effect)
            counter = conn.counter if conn else None
            if counter is not None:
                counter.hold()
            try:
                # the step's memory of answers keys on every method and path shown too (a
                # push's or a GraphQL effect's key does not hold them)
                answer, who, how, at = await self.gate.ask_once(
                    step, (*effect.key, "methods", *question["method_override"],
                           "paths", *question["rewrite_paths"]), question, d)
            finally:
                if counter is not None:
                    counter.release()
            rec.update(answer=answer, answered_by=who, answered_how=how, answered_at=at)
            d = dataclasses.replace(d, action="allow") if answer == "allow" else dataclasses.replace(
                d, action="deny", reason=f"{d.reason}; not approved ({how})")
        rec["bytes_up"] = len(flow.request.raw_content or b"")
        if d.action != "allow":
            flow.response = deny_response(flow, d, req.body)
            flow.metadata["envgit.answered"] = True
            return
        rec["irreversible"] = d.irreversible
        if not flow.metadata.get(bodies.PARTIAL):
            _frame_body(flow.request)
            return
        rec["bytes_up"] = 0

        def count(chunk: bytes) -> bytes:            # the buffered part, then the rest
            rec["bytes_up"] += len(chunk)
            return chunk
        flow.request.stream = count
        if d.watch is not None:
            flow.metadata[bodies.CUT] = self._cutter(flow, d.watch, rec)

    def _cutter(self, flow, watch, rec):
        """chunk -> "" (send it) or why the request is cut off there (a rule's markers are
        complete: the server must not receive that chunk)."""
        scan = watch.scanner()

        def cut(chunk: bytes) -> str:
            if not scan.feed(chunk):
                return ""
            w = watch.decision
            rec.update(decision="deny", rule=w.rule, kind=w.kind, reason=w.reason, irreversible=False)
            return _denial_text(flow, w)
        return cut

    def _question(self, step, flow, d, req, effect) -> dict:
        """What the person is asked: the request, and the one effect an answer covers."""
        q = {k: v for k, v in self._record(flow, d).items()
             if k in ("method", "scheme", "path", "rule", "kind", "reason")}
        q.update(step=step, host=hostnames.norm_host(req.host), port=req.port, **effect.shown)
        # What a remembered grant matches the query by (daemon/grants.py): never its values.
        q["query_sha256"] = query_digest(req.query)
        # Every other method the server may act on (policy/acts.py, the one reader): a grant
        # requires the same, so a POST granted does not cover a POST whose form says
        # _method=DELETE; and every path a rewrite header routes it to.
        q["method_override"] = sorted(acts.methods(req) - {req.method.upper()})
        q["rewrite_paths"] = acts.paths(req)[1:]
        # The prompt and `envgit pending` print the kind: it names what the answer covers
        # beyond the refs they print themselves.
        ops = "; ".join(f"{o['type']} {o['name'] + ' ' if o['name'] else ''}{{ {', '.join(o['fields'])} }}"
                        for o in effect.shown.get("operations", ()))
        opts = ", ".join(effect.shown.get("options", ()))
        if ops or opts:
            q["kind"] = f"{q['kind']}: {ops}" if ops else f"{q['kind']} with push options {opts}"
        q["covers"] = {
            "allow": "this request's effect only" + (
                ": these ref updates of this repository" if "refs" in effect.shown else
                ": these GraphQL operations" if "operations" in effect.shown else
                ": this method, host, path and query") + "; anything else is asked again",
            "allow-rule": f"every request rule {d.rule} matches on {_hostport(req.host, req.port)} "
                          "for the rest of this step"}
        return q

    @staticmethod
    def _record(flow, d, **extra) -> dict:
        r = flow.request
        return {"method": r.method, "scheme": r.scheme, "host": r.pretty_host, "port": r.port,
                "path": redact_path(r.path), "status": None, "bytes_up": 0, "bytes_down": 0,
                "duration_ms": None, "decision": d.action, "rule": d.rule, "kind": d.kind,
                "reason": d.reason, "irreversible": False,
                "intercepted": True, "started_at": time.time(), **extra}

    def responseheaders(self, flow: http.HTTPFlow):
        rec = flow.metadata.get("envgit.record")
        if flow.response is not None and flow.response.status_code == 101:
            self._refuse_bad_101(flow, rec)
        if rec is None or flow.metadata.get("envgit.answered"):
            return

        def count(chunk: bytes) -> bytes:
            rec["bytes_down"] += len(chunk)
            return chunk
        flow.response.stream = count

    @staticmethod
    def _refuse_bad_101(flow, rec) -> None:
        """Every host: a 101 that is not the WebSocket handshake asked for (proxy/upgrade.py)
        becomes a 502; the connection closes after it, nothing is relayed."""
        why = upgrade.invalid(flow.request, flow.response)
        if why is None:
            return
        d = network.Decision("deny", "builtin:upgrade", f"a 101 from {flow.request.pretty_host} was "
                             f"refused: {why}; nothing after it is passed on",
                             hint="an upgrade goes through only as a WebSocket handshake the "
                                  "policy allowed (network.l7[host].websocket)")
        flow.response = http.Response.make(502, _denial_text(flow, d), {
            "Content-Type": "text/plain; charset=utf-8", "X-Envgit-Rule": d.rule, "Connection": "close"})
        flow.metadata["envgit.answered"] = True
        if rec is not None:
            rec.update(decision="deny", rule=d.rule, reason=d.reason, kind="upgrade")

    def response(self, flow: http.HTTPFlow):
        on_body = flow.metadata.pop(bodies.ON_BODY, None)
        if on_body is not None:         # a buffered body looked at before it is recorded and
            on_body(flow)               # sent on (credentials.CredentialSwap._on_body)
        self._finish(flow)

    def error(self, flow: http.HTTPFlow):
        msg = flow.error.msg if flow.error else "error"
        creds = getattr(self.gate, "credentials", None)
        policy = self.gate.policy()
        if creds is not None and getattr(policy, "credentials", None) and flow.killable and \
                creds._found_real(policy, [msg]):
            # mitmproxy answers the step with this text itself (a 502 quoting a response head
            # it could not parse, with the token the server echoed in it): killed here, the
            # step gets the connection's close instead; the record is scrubbed (gate.emit).
            flow.kill()
        self._finish(flow, error=msg)

    def _finish(self, flow, error=None):
        rec = flow.metadata.pop("envgit.record", None)
        if rec is None:
            return
        if flow.response is not None:
            rec["status"] = flow.response.status_code
            if not rec["bytes_down"] and flow.response.raw_content:
                rec["bytes_down"] = len(flow.response.raw_content)   # answered by the gate
        if error:
            rec["error"] = error
        rec["duration_ms"] = round((time.time() - rec["started_at"]) * 1000, 2)
        self.gate.emit(flow.metadata.get("envgit.step"), rec)
