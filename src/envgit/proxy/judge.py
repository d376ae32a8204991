"""The judge: turns each connection and request into a question for the policy
(envgit.policy.network) and carries out the answer. Nothing here decides: it builds the
Request, acts on the Decision, holds asks, and makes the request's record (record.py sends it).

Event order for one client connection (Steps has authenticated it first: steps.py):
  http_connect        CONNECT host:port -> judge_connect: 403, or tunnel/intercept
  tls_clienthello     tunnelled hosts: passed through untouched (no TLS termination)
  server_connect(ed)  ENVGIT_RESOLVE names and DNS answers (judged by judge_address: Gate.route)
  request             the whole (decoded) request -> decide_request: deny / ask / allow
  responseheaders     a 101 that is not the WebSocket handshake asked for: 502 (upgrade.py)

Request bodies are buffered up to netrequest.BODY_CAP before `request` (bodies.py): a larger one
is judged on its first BODY_CAP bytes (a rule that needs more doubts, and matches), then
streamed on if allowed, or read to its end and dropped if denied. Nothing reaches the server
before the request is judged.

An `ask` is asked about one effect (approval.approval_effect), and the answer covers exactly
that effect for the rest of the step; while a person decides, the gate reads nothing more
from that client. An effect that cannot be known (a push whose commands cannot be read, a
GraphQL request whose operations cannot) is denied without asking.
"""

import dataclasses
import time

from mitmproxy import http

from ..policy import acts, hostnames, learn, network
from ..policy.approval import Effect, approval_effect, query_digest
from . import record, upgrade
from .flows import as_request, as_texts, conn_of, denial_text, deny_response, hostport
from .flowstate import ANSWERED, CUT, JUDGED, JUDGED_AS, PARTIAL, RECORD, STEP


def _frame_body(r: http.Request) -> None:
    # An HTTP/2 request body has no Content-Length of its own; mitmproxy (12.3.1) sends it to
    # an HTTP/1 server unframed, and the server reads an empty body (seen with git push).
    if r.raw_content and "content-length" not in r.headers and \
            "chunked" not in r.headers.get("transfer-encoding", "").lower():
        r.headers["content-length"] = str(len(r.raw_content))


class Judge:
    """One gate's judging. `gate` supplies the policy, the steps' state, asks and records."""

    def __init__(self, gate):
        self.gate = gate

    # --- connections ---------------------------------------------------------------------

    def http_connect(self, flow: http.HTTPFlow):
        if flow.response is not None:                    # not a step's (407)
            return
        d = network.judge_connect(self.gate.policy(), flow.request.host, flow.request.port)
        if d.action != "allow" and self.gate.learning(flow.metadata.get(STEP)):
            d, lesson = learn.judge_connect(self.gate.policy(), flow.request.host, flow.request.port)
            conn = conn_of(flow)
            if lesson is not None and conn is not None:
                conn.learned = lesson       # intercepted (tls_clienthello), each request judged
        if d.action != "allow":
            flow.response = deny_response(flow, d)
            self.gate.emit(flow.metadata.get(STEP), record.make(flow, d, status=403, intercepted=False,
                                                                duration_ms=0))

    def tls_clienthello(self, data):
        conn = self.gate.conn_of(data.context.client)
        if conn is None or conn.connect is None:
            return
        sni = data.client_hello.sni
        if conn.learned is None and not network.needs_interception(self.gate.policy(), *conn.connect, sni=sni):
            data.ignore_connection = True
            conn.tunnelled = True

    async def server_connect(self, data):
        await self.gate.route(data.server)      # the address a name leads to, judged

    def server_connected(self, data):
        self.gate.unroute(data.server)

    def server_connect_error(self, data):
        self.gate.unroute(data.server)

    # --- requests ------------------------------------------------------------------------

    async def request(self, flow: http.HTTPFlow):
        conn = conn_of(flow)
        if conn is not None:            # a tunnel learn mode opened has had a request in it
            conn.requests += 1
        if flow.response is not None:                    # answered already (407, a misuse)
            return
        if flow.metadata.get(JUDGED):                    # the end of a body streamed on
            return
        flow.metadata[JUDGED] = True
        step = flow.metadata.get(STEP)
        if not self.gate.step_open(step):
            d = network.Decision("deny", "builtin:step-closed", f"step {step} has ended",
                                 hint="each command runs as its own step; start it again")
            flow.response = deny_response(flow, d)
            return
        started = time.time()
        req = as_request(flow)
        lesson = None
        if self.gate.learning(step):    # the gate's judging, wrapped (policy/learn.py)
            d, lesson = learn.decide_request(self.gate.policy(), req)
        else:
            d = network.decide_request(self.gate.policy(), req)
        effect = approval_effect(d, req) if d.action == "ask" else None
        if effect is not None and effect.doubt:
            d = dataclasses.replace(d, action="deny", reason=f"{d.reason}; {effect.doubt}, so "
                                    "nobody can be asked about it")
        rec = record.make(flow, d, started_at=started, host=req.host, port=req.port)
        if lesson is not None:
            rec["learn"] = lesson
        flow.metadata[RECORD] = rec
        flow.metadata[JUDGED_AS] = req      # the record's facts read it (its body decoded once)
        if d.action == "ask" and effect is not None:
            d = await self._ask(flow, step, d, req, effect, rec)
        if d.action != "allow":
            flow.response = deny_response(flow, d, req.body)
            flow.metadata[ANSWERED] = True
            return
        rec["irreversible"] = d.irreversible
        if not flow.metadata.get(PARTIAL):
            _frame_body(flow.request)
            return
        if d.watch is not None:
            flow.metadata[CUT] = self._cutter(flow, d.watch, rec)

    async def _ask(self, flow, step, d, req, effect: Effect, rec: dict) -> network.Decision:
        """The answer to an `ask`, as the decision it makes: allow, or deny saying so."""
        question = self._question(step, flow, d, req, effect)
        conn = conn_of(flow)
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
        return dataclasses.replace(d, action="allow") if answer == "allow" else dataclasses.replace(
            d, action="deny", reason=f"{d.reason}; not approved ({how})")

    def _cutter(self, flow, watch, rec):
        """chunk -> "" (send it) or why the request is cut off there (a rule's markers are
        complete: the server must not receive that chunk)."""
        scan = watch.scanner()

        def cut(chunk: bytes) -> str:
            if not scan.feed(chunk):
                return ""
            w = watch.decision
            rec.update(decision="deny", rule=w.rule, kind=w.kind, reason=w.reason, irreversible=False)
            return denial_text(flow, w)
        return cut

    def _question(self, step, flow, d, req, effect) -> dict:
        """What the person is asked: the request, and the one effect an answer covers."""
        q = {k: v for k, v in record.make(flow, d).items()
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
            "allow-rule": f"every request rule {d.rule} matches on {hostport(req.host, req.port)} "
                          "for the rest of this step"}
        return as_texts(q)      # (a path's byte that is not UTF-8 as %XX: asked and recorded)

    # --- responses -----------------------------------------------------------------------

    def responseheaders(self, flow: http.HTTPFlow):
        """Every host: a 101 that is not the WebSocket handshake asked for (proxy/upgrade.py)
        becomes a 502; the connection closes after it, nothing is relayed."""
        if flow.response is None or flow.response.status_code != 101:
            return
        why = upgrade.invalid(flow.request, flow.response)
        if why is None:
            return
        d = network.Decision("deny", "builtin:upgrade", f"a 101 from {flow.request.pretty_host} was "
                             f"refused: {why}; nothing after it is passed on",
                             hint="an upgrade goes through only as a WebSocket handshake the "
                                  "policy allowed (network.l7[host].websocket)")
        flow.response = http.Response.make(502, denial_text(flow, d), {
            "Content-Type": "text/plain; charset=utf-8", "X-Envgit-Rule": d.rule, "Connection": "close"})
        flow.metadata[ANSWERED] = True
        rec = flow.metadata.get(RECORD)
        if rec is not None:
            rec.update(decision="deny", rule=d.rule, reason=d.reason, kind="upgrade")
