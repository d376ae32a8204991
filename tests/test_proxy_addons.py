"""The gate's mitmproxy addons, one job each (src/envgit/proxy/flowstate.py gives their order),
driven in process with mitmproxy's test helpers: `tflow` flows through each addon's event
methods inside `taddons.context()`, in the order the gate registers them.

The only fakes are the gate object the addons receive (`FakeGate`: the policy, the steps'
proxy credentials, the connections, the journal, kept in memory) and the trust check of the
credentials' sources (`TrustedSources`: a person's approval, read from disk by hostcmd/trust.py,
is left out). The end-to-end tests, tests/test_network_gate.py and tests/test_credentials.py,
drive the real proxy with real clients.
"""

import asyncio
import base64

from mitmproxy import http
from mitmproxy.proxy.layers.http import (
    HttpConnectHook,
    HttpRequestHeadersHook,
    HttpRequestHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.test import taddons, tflow, tutils

from conftest import network_policy
from envgit.credentials.placeholder import SESSION
from envgit.credentials.source import Sources
from envgit.proxy.credentials import CredentialSwap
from envgit.proxy.credvalues import CredentialValues
from envgit.proxy.echoguard import EchoGuard
from envgit.proxy.flowstate import RECORD, STEP, Conn
from envgit.proxy.judge import Judge
from envgit.proxy.record import Record
from envgit.proxy.steps import Steps

STEP_ID, USER, PASSWORD = 7, "step7", "right-password"
REAL = "ghp_" + "R" * 36                          # the real value the daemon would read
GH = {"hosts": ["api.github.com"], "from": {"env": "GH_REAL"}}


class TrustedSources(Sources):
    """The session's real values, without the check that a person trusted the policy's source
    (hostcmd/trust.py reads that approval from disk)."""

    def value(self, name, source, policy=None):
        return super().value(name, source)


class FakeGate:
    """What the addons ask of gate.Gate, in memory: the policy, which step a proxy credential
    names, the connections (flowstate.Conn by client), the records sent to the journal."""

    def __init__(self, policy):
        self._policy = policy
        self.credentials = CredentialValues(TrustedSources({"GH_REAL": REAL}))
        self.conns: dict[str, Conn] = {}
        self.records: list[tuple[int, dict]] = []

    def policy(self):
        return self._policy

    def conn_of(self, client):
        return self.conns.setdefault(client.id, Conn())

    def step_of(self, user, password, counter=None):
        return STEP_ID if (user, password) == (USER, PASSWORD) else None

    def step_open(self, step):
        return step == STEP_ID

    def learning(self, step):
        return False                    # learn mode: tests/test_learn_mode.py

    def emit(self, step, rec):
        self.records.append((step, rec))

    async def ask_once(self, *args):
        raise AssertionError("nothing here is asked")


def policy(credentials=None):
    p = network_policy(["api.github.com", "uploads.github.com"])
    p.credentials = credentials or {}
    return p


def addons(gate):
    """The gate's addons, in its order (gate.py)."""
    return [Steps(gate), Judge(gate), Record(gate), CredentialSwap(gate), EchoGuard(gate)]


async def event(tctx, chain, hook):
    """One mitmproxy event through every addon in turn, as the master sends it (without the
    master's catch-all, so an addon's error fails the test)."""
    for addon in chain:
        await tctx.master.addons.invoke_addon(addon, hook)


def auth(user=USER, password=PASSWORD) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def client(host):
    c = tflow.tclient_conn()
    c.sni = host
    return c


def connect(host, port=443, proxy_auth=None):
    headers = http.Headers(**({"proxy-authorization": proxy_auth} if proxy_auth else {}))
    return tflow.tflow(client_conn=client(host), req=tutils.treq(
        method=b"CONNECT", scheme=b"", host=host, port=port, authority=f"{host}:{port}".encode(),
        path=b"", headers=headers, content=b""))


def in_tunnel(tunnel, method, path, headers=(), body=b""):
    """A request inside the tunnel `tunnel` (a CONNECT flow the addons have seen)."""
    host, port = tunnel.request.host, tunnel.request.port
    fields = [(b"host", host.encode()), *((k.encode(), v.encode()) for k, v in headers)]
    if body:
        fields.append((b"content-length", str(len(body)).encode()))
    return tflow.tflow(client_conn=tunnel.client_conn, req=tutils.treq(
        method=method.encode(), scheme=b"https", host=host, port=port, authority=b"",
        path=path.encode(), headers=http.Headers(fields), content=body))


async def request(tctx, chain, flow):
    for hook in (HttpRequestHeadersHook, HttpRequestHook):
        await event(tctx, chain, hook(flow))


def test_steps_refuses_a_connection_without_a_steps_proxy_credentials_with_407():
    async def main():
        gate = FakeGate(policy())
        chain = addons(gate)
        with taddons.context(*chain) as tctx:
            for proxy_auth in (None, auth(password="wrong"), "Bearer " + PASSWORD):
                flow = connect("api.github.com", proxy_auth=proxy_auth)
                await event(tctx, chain, HttpConnectHook(flow))
                assert flow.response.status_code == 407
                assert "Proxy-Authenticate" in flow.response.headers
            plain = tflow.tflow(req=tutils.treq(host="api.github.com", port=80))
            await request(tctx, chain, plain)
            assert plain.response.status_code == 407
            assert gate.records == []                  # a stranger's connection is nobody's step

            good = connect("api.github.com", proxy_auth=auth())
            await event(tctx, chain, HttpConnectHook(good))
            assert good.response is None and good.metadata[STEP] == STEP_ID
            assert "proxy-authorization" not in good.request.headers
            inside = in_tunnel(good, "GET", "/user")
            await event(tctx, chain, HttpRequestHeadersHook(inside))
            assert inside.metadata[STEP] == STEP_ID    # the tunnel's step, asked once
    asyncio.run(main())


def test_judge_answers_a_denied_post_with_the_denial_and_records_it():
    async def main():
        gate = FakeGate(policy())
        chain = addons(gate)
        with taddons.context(*chain) as tctx:
            tunnel = connect("api.github.com", proxy_auth=auth())
            await event(tctx, chain, HttpConnectHook(tunnel))
            # the default preset: a GitHub GraphQL mutation is denied, nobody is asked
            mutation = b'{"query": "mutation { deleteRepository(input: {}) { clientMutationId } }"}'
            flow = in_tunnel(tunnel, "POST", "/graphql", [("content-type", "application/json")], mutation)
            await request(tctx, chain, flow)
            assert flow.response.status_code == 403
            assert flow.response.headers["X-Envgit-Rule"] == "preset:default/github-graphql-mutation"
            assert flow.response.content.startswith(b"envgit: denied POST api.github.com/graphql")
            await event(tctx, chain, HttpResponseHook(flow))
            (step, rec), = gate.records
            assert step == STEP_ID and rec["status"] == 403
            assert (rec["decision"], rec["rule"]) == ("deny", "preset:default/github-graphql-mutation")
            assert (rec["method"], rec["host"], rec["path"]) == ("POST", "api.github.com", "/graphql")
            assert rec["bytes_up"] == len(mutation)

            post = in_tunnel(tunnel, "POST", "/graphql", [("content-type", "application/json")],
                             b'{"query": "query { viewer { login } }"}')
            await request(tctx, chain, post)
            assert post.response is None            # allowed: no answer of the gate's own
            assert post.metadata[RECORD]["decision"] == "allow"
            assert post.metadata[RECORD]["bytes_up"] == len(post.request.content)
    asyncio.run(main())


def test_credential_swap_puts_the_real_value_in_only_on_a_host_the_credential_covers():
    async def main():
        gate = FakeGate(policy({"gh": GH}))
        placeholder = SESSION.of("gh", GH)["token"]
        chain = addons(gate)
        with taddons.context(*chain) as tctx:
            covered = connect("api.github.com", proxy_auth=auth())
            other = connect("uploads.github.com", proxy_auth=auth())
            for tunnel in (covered, other):
                await event(tctx, chain, HttpConnectHook(tunnel))
            header = [("authorization", f"Bearer {placeholder}")]

            there = in_tunnel(covered, "GET", "/user", header)
            await request(tctx, chain, there)
            assert there.response is None
            assert there.request.headers["authorization"] == f"Bearer {REAL}"
            assert there.metadata[RECORD]["credential"] == "gh"

            elsewhere = in_tunnel(other, "GET", "/user", header)
            await request(tctx, chain, elsewhere)
            assert elsewhere.response.status_code == 403
            assert elsewhere.request.headers["authorization"] == f"Bearer {placeholder}"
            (step, rec), = gate.records
            assert (rec["rule"], rec["credential"], rec["host"]) == ("credential-misuse", "gh",
                                                                    "uploads.github.com")
            assert REAL not in repr(rec) and placeholder not in repr(rec)
    asyncio.run(main())


def test_echo_guard_puts_a_real_value_in_an_answer_back_as_its_placeholder():
    async def main():
        gate = FakeGate(policy({"gh": GH}))
        placeholder = SESSION.of("gh", GH)["token"]
        chain = addons(gate)
        with taddons.context(*chain) as tctx:
            tunnel = connect("api.github.com", proxy_auth=auth())
            await event(tctx, chain, HttpConnectHook(tunnel))
            flow = in_tunnel(tunnel, "GET", "/debug")
            await request(tctx, chain, flow)
            body = f'{{"you sent": "Bearer {REAL}"}}'.encode()
            flow.response = tutils.tresp(content=body, headers=http.Headers(
                content_type="application/json", content_length=str(len(body))))
            flow.response.headers["X-Echo"] = REAL
            await event(tctx, chain, HttpResponseHeadersHook(flow))
            await event(tctx, chain, HttpResponseHook(flow))
            assert flow.response.content == f'{{"you sent": "Bearer {placeholder}"}}'.encode()
            assert flow.response.headers["X-Echo"] == placeholder
            (step, rec), = gate.records
            assert rec["credential_echo"] == "gh" and rec["status"] == 200
    asyncio.run(main())
