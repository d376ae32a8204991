"""Red team, round 14: answers that cover a wider method than the one asked about.

A grant (and an answer within one step) for `POST /api/one` must not cover a POST whose form
says `_method=DELETE` (Rails' Rack::MethodOverride, Laravel and Symfony act on it): the gate
reads the form for that (proxy/credentials.py `_methods`). But

1. the gate looks for the bytes `_method` in the raw body before it parses the form, and a
   form field's NAME is percent-decoded by every server (`%5Fmethod=DELETE` is `_method`
   to Rack): a remembered grant for POST /api/one lets `%5Fmethod=DELETE` through unasked;
2. within one step, the answer is remembered under a key (network.approval_effect) made of
   the method, the override HEADERS only, host, port, path and query: after "allow once" for
   POST /api/one, a POST /api/one whose form says `_method=DELETE` is let through as
   "given earlier in this step", though the question the person answered named no override.

The server here acts as Rack does (a form's `_method` on a POST is the method) and records
what it acted on: the oracle. Nobody was asked about a DELETE."""

import json
import shutil
import threading
import time
from urllib.parse import parse_qs

import pytest

from gatekit import hostport, netproject, servers
from harness import attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

ASK_API = ("irreversible:\n  - net: {host: \"*.example.test\", method: \"*\", path: \"/api/**\"}\n"
           "    action: ask\n    name: api-write\n")
CURL = "curl -s -o /dev/null -w '%{http_code}\\n'"
FORM = "-H 'Content-Type: application/x-www-form-urlencoded'"
ACTED: list = []


def _rack(method, path, headers, body):
    """A server that honours a form's _method on a POST, as Rack::MethodOverride does."""
    acted = method
    if method == "POST" and "x-www-form-urlencoded" in (headers.get("content-type") or ""):
        m = parse_qs((body or b"").decode("latin-1")).get("_method")
        if m:
            acted = m[0].upper()
    ACTED.append((acted, path.partition("?")[0]))
    return 200, {"Content-Type": "application/json"}, b'{"data": {}}'


class Person:
    """Another terminal: answers each question with `decide(question)`'s argv."""

    def __init__(self, attacker, decide):
        self.attacker, self.decide, self.seen = attacker, decide, []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        answered = set()
        while not self.stop.is_set():
            try:
                asks = json.loads(self.attacker.envgit("pending", "--json").stdout or "[]")
            except ValueError:
                asks = []
            for a in asks:
                if a["id"] not in answered:
                    answered.add(a["id"])
                    self.seen.append(a["question"])
                    self.attacker.envgit(*self.decide(a["question"]), str(a["id"]))
            time.sleep(0.1)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(30)


@pytest.fixture
def world():
    ACTED.clear()
    with servers(_rack) as (git, stub):
        yield git, stub


def _deletes():
    return [p for m, p in ACTED if m == "DELETE"]


def test_a_grant_for_post_covers_a_percent_encoded_method_override(attacker, world):
    git, stub = world
    netproject(attacker, git, stub, ASK_API)
    api = hostport(stub, "stub.example.test")
    post = f"{CURL} -X POST {FORM} --data-binary"
    with Person(attacker, lambda q: ["approve", "--remember"]):
        r = attacker.run(f"{post} a=1 https://{api}/api/one", timeout=120)
    assert r.stdout.split() == ["200"], r.stdout + r.stderr
    assert [g["scope"]["method"] for g in
            json.loads(attacker.envgit("grants", "--json", check=True).stdout)] == ["POST"]
    assert _deletes() == []
    # later steps (each its own: within a step the first answer is reused for the same key):
    # the plain `_method=DELETE` is asked (and denied); the encoded one?
    with Person(attacker, lambda q: ["deny"]) as p:
        codes = [attacker.run(f"{post} {form} https://{api}/api/one", timeout=120).stdout.strip()
                 for form in ("_method=DELETE", "%5Fmethod=DELETE")]
    assert codes[0] == "403", codes                        # the gate reads a plain one
    assert _deletes() == [] and codes == ["403", "403"], (
        f"a grant for POST /api/one let a DELETE through unasked (%5Fmethod): server acted on "
        f"{ACTED}, codes {codes}, questions seen {[q.get('method_override') for q in p.seen]}")


def test_allow_once_in_a_step_covers_a_later_form_method_override(attacker, world):
    git, stub = world
    netproject(attacker, git, stub, ASK_API)
    api = hostport(stub, "stub.example.test")
    post = f"{CURL} -X POST {FORM} --data-binary"

    def decide(q):                       # the person allows the POST they are shown, nothing else
        return ["approve"] if not q.get("method_override") else ["deny"]
    with Person(attacker, decide) as p:
        r = attacker.run(f"{post} a=1 https://{api}/api/one; "
                         f"{post} _method=DELETE https://{api}/api/one", timeout=180)
    codes = r.stdout.split()
    assert codes[0] == "200", (codes, r.stderr)
    assert _deletes() == [] and codes == ["200", "403"], (
        f"'allow once' for POST /api/one let a DELETE (a form's _method) through in the same "
        f"step: the server acted on {ACTED}; the person was asked {len(p.seen)} time(s): "
        f"{[(q.get('method'), q.get('method_override')) for q in p.seen]}")
