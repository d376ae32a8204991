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
    """Three steps: a GET and a refused POST to the API, a GET to a host the policy does not
    allow, another GET to the API."""
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
        env.run(f"curl -sS {url}/items/1")
        steps = json.loads(env.envgit("log", "--json", check=True).stdout)
        reqs = [(q["method"], q["host"], q["path"], q["decision"], q["rule"]) for s in steps
                for q in s["requests"]]
        # what was recorded: the gate let the GETs through, refused the POST and the other host
        assert ("GET", "127.0.0.1", "/items", "allow", f"network.l7[127.0.0.1:{port}]") in reqs or \
            ("GET", "127.0.0.1", "/items", "allow", "network.allow") in reqs, reqs
        assert ("POST", "127.0.0.1", "/items", "deny", "api-write") in reqs, reqs
        assert ("GET", "denied.example.test", "/thing", "deny", "network.allow") in reqs, reqs
        assert ("POST", "/items") not in api.hits and ("GET", "/items/1") in api.hits
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
    assert doc["steps"] == [] and doc["summary"]["requests"] >= 4, doc
    s = doc["summary"]
    assert s["unchanged"] == s["requests"] and s["cannot_replay"] == 0, s
    assert "0 newly allowed" in r.stdout and "Traceback" not in r.stderr


def test_a_candidate_allowing_the_denied_host_lists_it_newly_allowed(session):
    env, port, tmp = session
    r, j, doc = replay(env, policy(port, denied_host_allowed=True), tmp, "host.yaml")
    assert r.returncode == 0 and j.returncode == 0, r.stdout + r.stderr
    assert changes(doc) == [("newly allowed", "GET", "denied.example.test", "/thing", "network.allow",
                             "network.allow")], doc
    assert doc["summary"]["newly_allowed"] == 1 and doc["summary"]["irreversible_newly_allowed"] == 0
    assert "newly allowed  GET denied.example.test/thing" in r.stdout, r.stdout
    # --steps keeps to the range: the other host's step is the second
    _, j, doc = replay(env, policy(port, denied_host_allowed=True), tmp, "host.yaml", "--steps", "3..")
    assert j.returncode == 0 and changes(doc) == [], doc


@pytest.mark.parametrize("action", ["allow", "ask"])
def test_a_candidate_loosening_the_irreversible_rule_is_listed_and_exits_1(session, action):
    env, port, tmp = session
    r, j, doc = replay(env, policy(port, write_action=action), tmp, f"write-{action}.yaml")
    want = 1 if action == "allow" else 0
    assert r.returncode == want and j.returncode == want, r.stdout + r.stderr
    label = "newly allowed" if action == "allow" else "newly asked"
    assert changes(doc) == [(label, "POST", "127.0.0.1", "/items", "api-write", "api-write")], doc
    assert doc["summary"]["irreversible_newly_allowed"] == want
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
    assert ("newly allowed", "POST", "127.0.0.1", "/items", "api-write", "network.allow") in changes(doc)
    assert doc["summary"]["irreversible_newly_allowed"] == 1


def test_without_the_write_rule_a_post_the_preset_reads_the_body_of_cannot_be_replayed(session):
    # the default preset's pypi-upload rule reads a POST's body on any host: the record holds
    # none, so the POST is counted as not replayable, never guessed allowed
    env, port, tmp = session
    r, j, doc = replay(env, policy(port, preset=True).split("  - name: api-write")[0], tmp, "preset.yaml")
    assert r.returncode == 0 and j.returncode == 0, r.stdout + r.stderr
    (q,) = [q for s in doc["steps"] for q in s["requests"]]
    assert q["change"] == "cannot replay" and q["method"] == "POST", q
    assert q["now"] is None and "(rule preset:default/" in q["lacks"], q
    assert doc["summary"]["cannot_replay"] == 1 and "cannot replay  POST" in r.stdout


def test_a_candidate_that_does_not_load_is_exit_2_with_file_and_line(session):
    env, port, tmp = session
    r, j, doc = replay(env, "version: 1\nnetwork:\n  allow: [\"a.test\"\n  l7: {}\n", tmp, "bad.yaml")
    assert r.returncode == 2 and j.returncode == 2
    assert f"{tmp / 'bad.yaml'}:4:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert doc["exit"] == 2 and "bad.yaml:4:" in doc["error"]
