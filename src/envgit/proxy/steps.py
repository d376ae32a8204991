"""The first addon: which step a connection (or a plain-HTTP request) belongs to.

A step's requests carry the credentials Gate.open_step made in Proxy-Authorization: once on
the CONNECT of a tunnel (every request inside it is the tunnel's step's), on every request of
plain HTTP. They are valid only from the step's own sandbox (Gate.step_of). Anything else is
answered 407 here, before any other addon judges it. The header never goes upstream.

Sets flow.metadata[STEP] and [CONN] (flowstate.py) for the addons after it.
"""

import base64
import binascii
import time

from mitmproxy import http

from .flows import proxy_auth_required
from .flowstate import CONN, STEP, Conn


class Steps:
    """Proxy authentication. `gate` supplies the connections (conn_of) and the steps (step_of)."""

    def __init__(self, gate):
        self.gate = gate

    def _conn(self, flow: http.HTTPFlow) -> Conn:
        conn = self.gate.conn_of(flow.client_conn)
        return conn if conn is not None else Conn()

    def _authenticate(self, flow: http.HTTPFlow, conn: Conn) -> int | None:
        value = flow.request.headers.pop("proxy-authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return self.gate.step_of(user, password, conn.counter)

    def http_connect(self, flow: http.HTTPFlow):
        conn = self._conn(flow)
        flow.metadata[CONN] = conn
        step = self._authenticate(flow, conn)
        if step is None:
            flow.response = proxy_auth_required()
            return
        conn.step, conn.connect, conn.started = step, (flow.request.host, flow.request.port), time.time()
        flow.metadata[STEP] = step

    def requestheaders(self, flow: http.HTTPFlow):
        conn = self._conn(flow)
        flow.metadata[CONN] = conn
        if conn.connect is not None:
            flow.request.headers.pop("proxy-authorization", None)   # never forwarded upstream
            flow.metadata[STEP] = conn.step
            return
        step = self._authenticate(flow, conn)            # plain HTTP: each request says
        if step is None:
            flow.response = proxy_auth_required()
            return
        flow.metadata[STEP] = step
