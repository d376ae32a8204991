"""The record addon: what the journal gets of each request and tunnel.

The record of a request is made by the judge (`make`, flow.metadata[RECORD]) and updated by the
addons after it (an answer, a credential's misuse or echo); this addon counts its bytes both
ways and sends it to the journal (Gate.emit, which scrubs real values from it) when the flow
ends: `response` or `error`. A tunnel's record is sent when its client disconnects (its bytes
are counted at the socket: gate.Counted). Records hold names, never values: the path's query
values are redacted (flows.redact_path); a request's `facts` are what the request rules read
beyond its request line (policy/replay.py `request_facts`: other methods, rewrite paths, a rule
header's value among those rules name, each body predicate's outcome), never a body.

Responses are streamed, counted on the way; with credentials a small one is buffered and looked
at first (EchoGuard's flow.metadata[ON_BODY], called here before the record is made).
"""

import time

from mitmproxy import http

from ..policy import hostnames
from ..policy.replay import request_facts
from .flows import as_request, as_text, redact_path
from .flowstate import ANSWERED, COUNTED, JUDGED_AS, ON_BODY, PARTIAL, RECORD, STEP


def make(flow: http.HTTPFlow, d, **extra) -> dict:
    """A request's record, as decided by `d` (a network.Decision); `extra` adds or overrides.
    Its host is where the request goes (a CONNECT's target), never the Host header a step
    wrote (`pretty_host`): `envgit policy suggest` reads it, and a CONNECT to a name carrying
    `Host: *.com` would have recorded a wildcard."""
    r = flow.request
    # mitmproxy upper-cases a method by Unicode's rules (`poſt` reads POST), which the judging
    # follows (a server may too); what the step sent is kept beside it when it differs
    sent = as_text(r.data.method.decode("utf-8", "surrogateescape"))
    return {**({"method_sent": sent} if sent != r.method else {}),
            "method": as_text(r.method), "scheme": r.scheme, "host": as_text(hostnames.norm_host(r.host)),
            "port": r.port,
            "path": redact_path(r.path), "status": None, "bytes_up": 0, "bytes_down": 0,
            "duration_ms": None, "decision": d.action, "rule": d.rule, "kind": d.kind,
            "reason": d.reason, "irreversible": False,
            "intercepted": True, "started_at": time.time(), **extra}


class Record:
    """One gate's records. `gate` supplies the connections (conn_of) and the journal (emit)."""

    def __init__(self, gate):
        self.gate = gate

    def client_disconnected(self, client):
        conn = self.gate.conn_of(client)
        if conn is not None and conn.learned is not None and not conn.requests and \
                conn.step is not None and conn.connect is not None:
            # a tunnel learn mode opened in which no request was seen (the client did not
            # accept the gate's certificate?): the host it wanted is still on record
            self.gate.emit(conn.step, {
                "method": "CONNECT", "scheme": "https", "host": conn.connect[0],
                "port": conn.connect[1], "path": "", "status": None, "bytes_up": 0, "bytes_down": 0,
                "duration_ms": round((time.time() - conn.started) * 1000, 1),
                "decision": "allow", "rule": "learn", "kind": "",
                "reason": f"let through in learn mode: {conn.learned['reason']}",
                "error": "no request was seen inside the tunnel", "learn": conn.learned,
                "irreversible": False, "intercepted": True, "started_at": conn.started})
            return
        if conn is None or not conn.tunnelled or conn.step is None or conn.connect is None:
            return
        c = conn.counter
        self.gate.emit(conn.step, {
            "method": "CONNECT", "scheme": "https", "host": conn.connect[0],
            "port": conn.connect[1], "path": "", "status": 200,
            "bytes_up": getattr(c, "up", None), "bytes_down": getattr(c, "down", None),
            "duration_ms": round((time.time() - conn.started) * 1000, 1),
            "decision": "allow", "rule": "network.allow", "kind": "tunnel",
            "irreversible": False, "intercepted": False, "started_at": conn.started})

    def request(self, flow: http.HTTPFlow):
        """After the judge: the request's bytes. A body streamed on past BODY_CAP (bodies.py) is
        counted as it goes, the buffered part first."""
        rec = flow.metadata.get(RECORD)
        if rec is None or flow.metadata.get(COUNTED):   # the end of a body streamed on
            return
        flow.metadata[COUNTED] = True
        # what the request rules read beyond the request line, as facts (never a body or a
        # header's value): what `envgit policy replay` judges a candidate policy on
        # (of the request as the judge read it: its body decoded and its predicates run once)
        rec["facts"] = request_facts(flow.metadata.pop(JUDGED_AS, None) or as_request(flow))
        rec["bytes_up"] = len(flow.request.raw_content or b"")
        if flow.response is not None or not flow.metadata.get(PARTIAL):
            return
        rec["bytes_up"] = 0

        def count(chunk: bytes) -> bytes:
            rec["bytes_up"] += len(chunk)
            return chunk
        flow.request.stream = count

    def responseheaders(self, flow: http.HTTPFlow):
        rec = flow.metadata.get(RECORD)
        if rec is None or flow.response is None or flow.metadata.get(ANSWERED):
            return

        def count(chunk: bytes) -> bytes:
            rec["bytes_down"] += len(chunk)
            return chunk
        flow.response.stream = count

    def response(self, flow: http.HTTPFlow):
        on_body = flow.metadata.pop(ON_BODY, None)
        if on_body is not None:         # a buffered body looked at before it is recorded and
            on_body(flow)               # sent on (EchoGuard._on_body)
        self._finish(flow)

    def error(self, flow: http.HTTPFlow):
        self._finish(flow, error=flow.error.msg if flow.error else "error")

    def _finish(self, flow: http.HTTPFlow, error: str | None = None) -> None:
        rec = flow.metadata.pop(RECORD, None)
        if rec is None:
            return
        if flow.response is not None:
            rec["status"] = flow.response.status_code
            if not rec["bytes_down"] and flow.response.raw_content:
                rec["bytes_down"] = len(flow.response.raw_content)   # answered by the gate
        if error:
            rec["error"] = error
        rec["duration_ms"] = round((time.time() - rec["started_at"]) * 1000, 2)
        if rec.get("decision") != "allow":
            # denied after all (a credential's misuse, a body cut off, a refused 101): learn
            # mode let nothing through, so the record says nothing of it
            rec.pop("learn", None)
        self.gate.emit(flow.metadata.get(STEP), rec)
