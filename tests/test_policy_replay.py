"""`envgit policy replay CANDIDATE`: the requests a session's steps made through the real gate
(real bwrap, the daemon's mitmproxy, a REST API on the host's 127.0.0.1) judged again by a
candidate policy with the gate's own decide_request, compared with what was recorded."""

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import Env, make_home

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


class _Api(BaseHTTPRequestHandler):
    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        self.server.hits.append((self.command, self.path))
        body = b'{"ok": true}\n'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *a):
        pass


def policy(port, write_action="deny", preset=True, denied_host_allowed=False):
    allow = f'"127.0.0.1:{port}"' + (', "denied.example.test"' if denied_host_allowed else "")
    return (f"version: 1\nnetwork:\n  allow: [{allow}]\nirreversible:\n"
            + ("  - preset: default\n" if preset else "")
            + f'  - name: api-write\n    net: {{ host: "127.0.0.1:{port}", method: POST }}\n'
              f"    action: {write_action}\n")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """Three steps: a GET and a refused POST to the API; a GET to a host the policy does not
    allow; another GET, a POST saying it is `npm publish` and an upgrade to the API."""
    api = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    api.hits = []
    threading.Thread(target=api.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    port = api.server_address[1]
    tmp = tmp_path_factory.mktemp("replay")
    home = make_home(tmp)
    root = home / "proj"
    root.mkdir()
    env = Env(home, root)
    env.envgit("init", check=True)
    env.write_policy(policy(port))
    url = f"http://127.0.0.1:{port}"
    try:
        env.run(f"curl -sS {url}/items && curl -sS -X POST -d '{{\"name\":\"x\"}}' "
                f"-H 'Content-Type: application/json' {url}/items")
        env.run("curl -sS -m 5 http://denied.example.test/thing")
        env.run(f"curl -sS {url}/items/1 && curl -sS -X POST -H 'npm-command: publish' -d x {url}/items; "
                f"curl -sS -H 'Upgrade: websocket' -H 'Connection: Upgrade' {url}/ws")
        steps = json.loads(env.envgit("log", "--json", check=True).stdout)
        reqs = [(q["method"], q["host"], q["path"], q["decision"], q["rule"]) for s in steps
                for q in s["requests"]]
        # what was recorded: the gate let the GETs through, refused the POST and the other host
        assert ("GET", "127.0.0.1", "/items", "allow", f"network.l7[127.0.0.1:{port}]") in reqs or \
            ("GET", "127.0.0.1", "/items", "allow", "network.allow") in reqs, reqs
        assert ("POST", "127.0.0.1", "/items", "deny", "api-write") in reqs, reqs
        assert ("GET", "denied.example.test", "/thing", "deny", "network.allow") in reqs, reqs
        assert ("GET", "127.0.0.1", "/ws", "deny", "builtin:upgrade") in reqs, reqs
        assert ("POST", "/items") not in api.hits and ("GET", "/items/1") in api.hits
        # what the rules read beyond the request line is recorded, as facts
        npm = [q for s in steps for q in s["requests"] if q["method"] == "POST"][1]
        assert npm["facts"]["headers"] == {"npm-command": "publish"}, npm
        assert npm["facts"]["body"]["pypi-upload"] is False and set(npm["facts"]) == {"body", "headers"}, npm
        ws = next(q for s in steps for q in s["requests"] if q["path"] == "/ws")
        assert ws["facts"]["upgrade"] == "websocket", ws
        yield env, port, tmp
    finally:
        env.stop()
        api.shutdown()
        api.server_close()


def replay(env, text, tmp, name, *extra):
    cand = tmp / name
    cand.write_text(text)
    r = env.envgit("policy", "replay", str(cand), *extra)
    j = env.envgit("policy", "replay", str(cand), "--json", *extra)
    return r, j, (json.loads(j.stdout) if j.stdout.strip() else None)


def changes(doc):
    return [(q["change"], q["method"], q["host"], q["path"], q["then"]["rule"], (q["now"] or {}).get("rule"))
            for s in doc["steps"] for q in s["requests"]]


def test_the_same_policy_changes_nothing(session):
    env, port, tmp = session
    r, j, doc = replay(env, policy(port), tmp, "same.yaml")
    assert r.returncode == 0 and j.returncode == 0, r.stderr + j.stderr
    assert doc["steps"] == [], doc
    s = doc["summary"]
    assert s["requests"] >= 6 and s["unchanged"] == s["requests"] and s["cannot_replay"] == 0, s
    assert "0 newly allowed" in r.stdout and "Traceback" not in r.stderr


def test_a_candidate_allowing_the_denied_host_lists_it_newly_allowed(session):
    env, port, tmp = session
    r, j, doc = replay(env, policy(port, denied_host_allowed=True), tmp, "host.yaml")
    assert r.returncode == 0 and j.returncode == 0, r.stdout + r.stderr
    assert changes(doc) == [
        ("newly allowed", "GET", "denied.example.test", "/thing", "network.allow", "network.allow")], doc
    assert doc["summary"]["newly_allowed"] == 1 and doc["summary"]["irreversible_newly_allowed"] == 0
    assert "newly allowed  GET denied.example.test/thing" in r.stdout, r.stdout
    # --steps keeps to the range: the other host's step is the second
    _, j, doc = replay(env, policy(port, denied_host_allowed=True), tmp, "host.yaml", "--steps", "..2")
    assert j.returncode == 0 and [c[3] for c in changes(doc)] == ["/thing"], doc
    _, j, doc = replay(env, policy(port, denied_host_allowed=True), tmp, "host.yaml", "--steps", "1..1")
    assert j.returncode == 0 and changes(doc) == [], doc


@pytest.mark.parametrize("action", ["allow", "ask"])
def test_a_candidate_loosening_the_irreversible_rule_is_listed_and_exits_1(session, action):
    env, port, tmp = session
    r, j, doc = replay(env, policy(port, write_action=action), tmp, f"write-{action}.yaml")
    want = 1 if action == "allow" else 0
    assert r.returncode == want and j.returncode == want, r.stdout + r.stderr
    label = "newly allowed" if action == "allow" else "newly asked"
    assert changes(doc) == [(label, "POST", "127.0.0.1", "/items", "api-write", "api-write")] * 2, doc
    assert doc["summary"]["irreversible_newly_allowed"] == 2 * want
    from test_cli_conventions import documented_keys  # the keys docs/JSON.md lists
    keys = documented_keys()
    assert set(doc) == keys["policy.replay"] and set(doc["summary"]) == keys["policy.replay.summary"]
    assert set(doc["steps"][0]) == keys["policy.replay.steps"]
    assert set(doc["steps"][0]["requests"][0]) == keys["policy.replay.request"]
    if want:
        assert f"newly allowed  POST 127.0.0.1:{port}/items  IRREVERSIBLE" in r.stdout, r.stdout
        assert "irreversible rule" in r.stderr


def test_a_candidate_without_the_write_rule_newly_allows_what_it_refused(session):
    env, port, tmp = session
    text = f'version: 1\nnetwork:\n  allow: ["127.0.0.1:{port}"]\nirreversible: []\n'
    r, j, doc = replay(env, text, tmp, "none.yaml")
    assert r.returncode == 1 and j.returncode == 1, r.stdout + r.stderr
    # (with no request rule on the host, an upgrade is not judged: as unjudged as a tunnel)
    assert changes(doc) == [("newly allowed", "POST", "127.0.0.1", "/items", "api-write", "network.allow")] * 2 + [
        ("newly allowed", "GET", "127.0.0.1", "/ws", "builtin:upgrade", "network.allow")], doc
    assert doc["summary"]["irreversible_newly_allowed"] == 2


def test_the_recorded_facts_decide_what_the_preset_reads(session):
    # without the project's own write rule, the default preset's rules decide the POSTs: they
    # read the npm-command header and the body (an upload's fields), which the record keeps as
    # facts. The plain POST is newly allowed (an irreversible rule refused it then: exit 1);
    # the one saying `npm publish` is refused by the preset's rule now
    env, port, tmp = session
    r, j, doc = replay(env, policy(port).split("  - name: api-write")[0], tmp, "preset.yaml")
    assert r.returncode == 1 and j.returncode == 1, r.stdout + r.stderr
    assert changes(doc) == [("newly allowed", "POST", "127.0.0.1", "/items", "api-write", "network.allow")], doc
    assert doc["summary"]["unchanged"] == doc["summary"]["requests"] - 1, doc   # the npm POST too
    assert f"newly allowed  POST 127.0.0.1:{port}/items  IRREVERSIBLE" in r.stdout, r.stdout


def test_a_candidate_letting_websockets_through_newly_allows_the_upgrade(session):
    env, port, tmp = session
    text = policy(port).replace("irreversible:", f'  l7:\n    "127.0.0.1:{port}": {{ websocket: allow }}\n'
                                "irreversible:")
    r, j, doc = replay(env, text, tmp, "ws.yaml")
    assert r.returncode == 0 and j.returncode == 0, r.stdout + r.stderr
    assert changes(doc) == [("newly allowed", "GET", "127.0.0.1", "/ws", "builtin:upgrade",
                             f"network.l7[127.0.0.1:{port}]")], doc


def test_a_record_without_facts_is_not_guessed(session):
    # a record made before the gate kept facts: the preset's rules read what it lacks
    from envgit.policy import load_policy
    from envgit.policy.replay import judge
    env, port, tmp = session
    cand = tmp / "preset-old.yaml"
    cand.write_text(policy(port).split("  - name: api-write")[0])
    rec = {"method": "POST", "scheme": "http", "host": "127.0.0.1", "port": port, "path": "/items",
           "decision": "deny", "rule": "api-write", "kind": "api-write", "intercepted": True}
    o = judge(load_policy(cand), rec)
    assert o.now is None and o.change == "cannot" and "(rule preset:default/" in o.lacks, o
    assert judge(load_policy(cand), {**rec, "method": "GET", "decision": "allow",
                                     "rule": "network.allow"}).change == ""


def test_a_candidate_that_does_not_load_is_exit_2_with_file_and_line(session):
    env, port, tmp = session
    r, j, doc = replay(env, "version: 1\nnetwork:\n  allow: [\"a.test\"\n  l7: {}\n", tmp, "bad.yaml")
    assert r.returncode == 2 and j.returncode == 2
    assert f"{tmp / 'bad.yaml'}:4:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert doc["exit"] == 2 and "bad.yaml:4:" in doc["error"]
