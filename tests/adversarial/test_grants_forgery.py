"""Issue 14: can a step create, widen or use a remembered grant it was not given?

A step may (1) try to answer its own question, with `remember`, over every socket it can reach
(the daemon's `.envgit/daemon.sock` is not in its view; `/run/envgit/control.sock` is an
agent session's inner socket, which offers run/record/mcp/status only), in the daemon's framing
and in JSON, while its request waits; (2) given a grant for one effect, try to stretch it: a
method-override header, other spellings of the path, another port's or host's name, a Host
header that differs from the CONNECT target. The oracle is the stub server's record of what
reached it and the journal's grants.

Last, the red team's cases (round 14): answers that covered a wider method than the one asked
about. A grant (and an answer within one step) for `POST /api/one` must not cover a POST whose
form says `_method=DELETE` (Rails' Rack::MethodOverride, Laravel and Symfony act on it): the
gate reads the form for that (proxy/credentials.py `_methods`). But
1. the gate looked for the bytes `_method` in the raw body before it parsed the form, and a
   form field's NAME is percent-decoded by every server (`%5Fmethod=DELETE` is `_method` to
   Rack): a remembered grant for POST /api/one let `%5Fmethod=DELETE` through unasked;
2. within one step, the answer was remembered under a key (approval.approval_effect) made of
   the method, the override HEADERS only, host, port, path and query: after "allow once" for
   POST /api/one, a POST /api/one whose form says `_method=DELETE` was let through as "given
   earlier in this step", though the question the person answered named no override.
The server there acts as Rack does (a form's `_method` on a POST is the method) and records
what it acted on: the oracle. Nobody was asked about a DELETE."""

import json
import shutil
import threading
import time
from urllib.parse import parse_qs

import pytest

from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

ASK_API = ("irreversible:\n  - net: {host: \"*.example.test\", method: \"*\", path: \"/api/**\"}\n"
           "    action: ask\n    name: api-write\n")
CURL = "curl -s -o /dev/null -w '%{http_code}\\n'"

FORGE = r'''
import glob, json, marshal, os, socket, sys
found = set(glob.glob("/run/**/*.sock", recursive=True) + glob.glob("/tmp/**/*.sock", recursive=True)
            + glob.glob(os.path.expanduser("~") + "/**/*.sock", recursive=True)
            + glob.glob(os.getcwd() + "/**/*.sock", recursive=True)
            + ["/run/envgit/control.sock", os.getcwd() + "/.envgit/daemon.sock"])
replies = []
for path in sorted(found):
    for n in range(1, 6):
        for msg in ({"op": "answer", "id": n, "answer": "allow", "uid": 0, "how": "ui",
                     "remember": {"path": "/**", "for_s": 2592000}},
                    {"op": "grants"}, {"op": "grant-revoke", "id": "g1", "uid": 0}):
            for body in (marshal.dumps(msg), json.dumps(msg).encode()):
                try:
                    s = socket.socket(socket.AF_UNIX)
                    s.settimeout(0.5)   # the oracle is what reached the stub and the grants, not the reply
                    s.connect(path)
                    s.sendall(len(body).to_bytes(4, "big") + body)
                    replies.append((path, s.recv(4096)[4:200].decode("latin-1")))
                    s.close()
                except OSError as e:
                    replies.append((path, type(e).__name__))
print("FORGED " + json.dumps(replies)[:4000])
'''


def _answer(attacker, decide, stop, seen):
    answered = set()
    while not stop.is_set():
        try:
            asks = json.loads(attacker.envgit("pending", "--json").stdout or "[]")
        except ValueError:
            asks = []
        for a in asks:
            if a["id"] not in answered:
                answered.add(a["id"])
                seen.append(a["question"])
                attacker.envgit(*decide(a["question"]), str(a["id"]))
        time.sleep(0.1)


class Person:
    def __init__(self, attacker, decide):
        self.attacker, self.decide, self.seen, self.stop = attacker, decide, [], threading.Event()
        self.t = threading.Thread(target=_answer, args=(attacker, decide, self.stop, self.seen), daemon=True)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(30)


def test_a_step_cannot_answer_or_remember_its_own_question(attacker, gate_servers):
    git, stub = gate_servers
    netproject(attacker, git, stub, ASK_API)
    api = hostport(stub, "stub.example.test")
    (attacker.root / "forge.py").write_text(FORGE)
    # the step's request waits for a person; meanwhile the step tries every socket it can see
    script = (f"{CURL} -X POST --data-binary x https://{api}/api/one > code & "
              "sleep 1; python3 forge.py; wait; cat code")
    with Person(attacker, lambda q: ["deny"]) as p:        # the person: a slow "no"
        time.sleep(0)
        r = attacker.run(script, timeout=120)
    assert "FORGED" in r.stdout, r.stdout + r.stderr
    assert r.stdout.split()[-1] == "403", r.stdout
    assert not [q for q in stub.requests if q["method"] == "POST"]              # the oracle
    assert json.loads(attacker.envgit("grants", "--all", "--json", check=True).stdout) == []
    assert len(p.seen) == 1
    step = json.loads(attacker.envgit("show", "last", "--json", check=True).stdout)
    assert [a["answer"] for a in step["approvals"]] == ["deny"] and not step["approvals"][0].get("granted_by")


def test_a_grant_does_not_stretch_to_what_it_was_not_given(attacker, gate_servers):
    git, stub = gate_servers
    netproject(attacker, git, stub, ASK_API)
    api = hostport(stub, "stub.example.test")
    other = hostport(stub, "gql.example.test")          # another host the same ask rule covers
    post = f"{CURL} -X POST --data-binary x"
    with Person(attacker, lambda q: ["approve", "--remember"]):
        assert attacker.run(f"{post} https://{api}/api/one", timeout=120).stdout.split() == ["200"]
    grants = json.loads(attacker.envgit("grants", "--json", check=True).stdout)
    assert [g["scope"]["path"] for g in grants] == ["/api/one"]
    attempts = [
        f"{post} -H 'X-HTTP-Method-Override: DELETE' https://{api}/api/one",     # a wider method
        f"{post} -X DELETE https://{api}/api/one",
        f"{post} --path-as-is https://{api}/api/one/",                           # other spellings
        f"{post} --path-as-is https://{api}/api//one",
        f"{post} --path-as-is 'https://{api}/api/one;x=1'",
        f"{post} --path-as-is https://{api}/api/%6fne",
        f"{post} --path-as-is https://{api}/api/x/../one",
        f"{post} 'https://{api}/api/one?_method=DELETE'",                        # another query
        f"{post} -H 'Host: {other}' https://{api}/api/one",                       # another host
        f"{post} https://{other}/api/one",
    ]
    with Person(attacker, lambda q: ["deny"]) as p:
        r = attacker.run("; ".join(attempts) + f"; {post} https://{api}/api/one", timeout=300)
    codes = r.stdout.split()
    assert codes[-1] == "200" and all(c != "200" for c in codes[:-1]), (" ".join(codes), r.stderr)
    # a form whose _method field says DELETE (Rails, Laravel, Symfony act on it), in a step of
    # its own (within one step the gate remembers each answer for the effect it keyed)
    form = f"{CURL} -X POST -H 'Content-Type: application/x-www-form-urlencoded' --data-binary '_method=DELETE'"
    with Person(attacker, lambda q: ["deny"]) as p2:
        r2 = attacker.run(f"{form} https://{api}/api/one", timeout=120)
    assert r2.stdout.split() == ["403"], r2.stdout + r2.stderr
    assert [q["method_override"] for q in p2.seen] == [["DELETE"]], p2.seen
    reached = [(q["headers"].get("host"), q["method"], q["path"]) for q in stub.requests if q["method"] != "GET"]
    assert reached == [(api, "POST", "/api/one")] * 2, reached                  # the oracle
    # each was put to the person (the Host one may be refused outright)
    assert len(p.seen) >= len(attempts) - 1, p.seen
    step = json.loads(attacker.envgit("show", "last~1", "--json", check=True).stdout)
    assert [a["granted_by"] for a in step["approvals"] if a.get("granted_by")] == ["g1"]


def test_an_answer_once_does_not_cover_a_form_saying_method_delete(attacker, gate_servers):
    """The same holds for "allow once" within a step: approving one POST does not approve a
    later POST to the same path whose form says _method=DELETE (found while building grants)."""
    git, stub = gate_servers
    netproject(attacker, git, stub, ASK_API)
    api = hostport(stub, "stub.example.test")
    form = f"{CURL} -X POST -H 'Content-Type: application/x-www-form-urlencoded' --data-binary"
    state = {"n": 0}

    def person(q):
        state["n"] += 1
        return ["approve"] if state["n"] == 1 else ["deny"]
    with Person(attacker, person) as p:
        r = attacker.run(f"{form} 'a=1' https://{api}/api/one; {form} 'a=2' https://{api}/api/one; "
                         f"{form} '_method=DELETE' https://{api}/api/one", timeout=120)
    assert r.stdout.split() == ["200", "200", "403"], r.stdout + r.stderr
    assert [q["body"] for q in stub.requests if q["method"] == "POST"] == [b"a=1", b"a=2"]   # the oracle
    assert [q["method_override"] for q in p.seen] == [[], ["DELETE"]]


# --- a form's method field against grants and answers (Rack's reading) ----------------------

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


@pytest.fixture
def rack_world():
    """The servers, the stub acting as Rack does (what it acted on: ACTED)."""
    ACTED.clear()
    with servers(_rack) as (git, stub):
        yield git, stub


def _deletes():
    return [p for m, p in ACTED if m == "DELETE"]


def test_a_grant_for_post_covers_a_percent_encoded_method_override(attacker, rack_world):
    git, stub = rack_world
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


def test_allow_once_in_a_step_covers_a_later_form_method_override(attacker, rack_world):
    git, stub = rack_world
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
