"""Issue 13 (second look at red team 13's fixes): WebSockets, where the policy allows them
(`network.l7[host]: {websocket: allow}`), are a channel past the request-level checks. From the
credential's host, a message echoes the real token the upgrade carried: the step must read
the placeholder. To another host, a message carries the placeholder: it is dropped before it
leaves and the step is marked. The server's log of messages is the oracle, with the canary.
The client inside is Python's standard library speaking RFC 6455 through the step's proxy
(tests/kit/websocket.py). Runs as root: the gate's judgement does not depend on the step's uid.

The red team's second look (round 13b): a real value echoed in two messages, or in a Close
frame's reason, reached the step (one message sent in several frames is held: mitmproxy joins
them before the gate looks). The gate rewrites each whole message from the server
(credentials.py websocket_message) but keeps nothing between messages, unlike a streamed HTTP
body, whose tail that could begin a real value is held for the next chunk. A server that
streams output in small messages (a CI log, a terminal, a chat token stream) splits the token
across two; each half passes. Both are open holes, marked xfail(strict) with why."""

import json
import shutil
from contextlib import contextmanager

import pytest

from conftest import CANARY
from gatekit import netproject, servers
from kit.websocket import CLIENT, ws_server

pytestmark = pytest.mark.skipif(shutil.which("socat") is None or shutil.which("python3") is None,
                                reason="socat or python3 is not installed")


@contextmanager
def world(attacker, other=True):
    """The WebSocket server as the credential's host, api.github.com (and, with `other`, as a
    second allowed host, stub.example.test), the client in the project as ws.py."""
    with servers() as (git, stub), ws_server(git.ca) as (port, seen):
        attacker.env["MY_TOKEN"] = CANARY
        api = f"api.github.com:{port}"
        second = f"stub.example.test:{port}" if other else None
        hosts = [api, second] if other else [api]
        netproject(attacker, git, stub, allow=hosts, tail=(
            "  l7:\n" + "".join(f"    \"{h}\": {{websocket: allow}}\n" for h in hosts) +
            f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"))
        attacker.run(f"cat > /tmp/ws.py <<'EOF'\n{CLIENT}\nEOF\ncp /tmp/ws.py ws.py")
        yield api, second, seen


def test_a_real_value_echoed_in_a_message_comes_back_as_the_placeholder(attacker):
    with world(attacker) as (api, other, seen):
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        r = attacker.run(f"python3 ws.py {api} echo-auth auth")
        out = r.stdout + r.stderr
        assert "101" in out, out
        assert seen and seen[-1][1] == f"Bearer {CANARY}", seen       # the real token arrived
        assert CANARY not in out, out
        assert f"answer: Bearer {ph}" in out, out


def test_the_placeholder_in_a_message_to_another_host_is_dropped_and_marked(attacker):
    with world(attacker) as (api, other, seen):
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        r = attacker.run(f"python3 ws.py {other} 'hello PH'")
        out = r.stdout + r.stderr
        assert "101" in out, out                          # the upgrade itself carried nothing
        assert not [m for m in seen if ph in m[2] or ph in m[1]], seen
        s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
        assert "credential-misuse" in s["marks"], (s["marks"], s["requests"])
        bad = [q for q in s["requests"] if q.get("rule") == "credential-misuse"]
        assert bad and bad[0]["credential"] == "tok" and bad[0]["host"] == "stub.example.test"
        attacker.run(f"python3 ws.py {other} 'hello plain'")
        assert [m for m in seen if m[2] == "hello plain"], seen   # an ordinary message passes


# --- a real value split across messages, or in a Close frame's reason ----------------------

@pytest.mark.xfail(strict=True, reason="open hole (docs/POLICY.md, THREATS): each WebSocket message is "
                   "rewritten on its own; a real value split across two messages is not held back, "
                   "since holding a message for the next changes an interactive stream's timing")
def test_a_real_value_echoed_in_two_messages_does_not_reach_the_step(attacker):
    with world(attacker, other=False) as (api, _, seen):
        r = attacker.run(f"python3 ws.py {api} echo-split auth 1")
        out = r.stdout + r.stderr
        assert "101" in out, out
        assert seen and seen[-1][1] == f"Bearer {CANARY}", seen       # the real token arrived
        joined = "".join(line.split(": ", 1)[1] for line in out.splitlines()
                         if line.startswith(("answer: ", "more: ")))
        assert CANARY not in joined, f"the real token reached the step in two messages:\n{out}"


@pytest.mark.xfail(strict=True, reason="open hole (docs/POLICY.md, THREATS): mitmproxy 12.3 forwards a "
                   "WebSocket Close frame without an addon hook that can rewrite its reason")
def test_a_real_value_echoed_in_a_close_reason_does_not_reach_the_step(attacker):
    """A Close frame's reason is no message: the gate never looks at it."""
    with world(attacker, other=False) as (api, _, seen):
        r = attacker.run(f"python3 ws.py {api} echo-close auth")
        out = r.stdout + r.stderr
        assert "101" in out, out
        assert seen and seen[-1][1] == f"Bearer {CANARY}", seen       # the real token arrived
        assert CANARY not in out, f"the real token reached the step in a Close frame's reason:\n{out}"

