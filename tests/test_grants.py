"""Remembered grants (issue 14), end to end: real steps (`envgit run`, bwrap) whose curl and
git go through the real gate to local HTTPS servers; a person at another terminal answers with
`envgit approve ID --remember` / `envgit deny`. The oracle is what reached the servers and what
the journal recorded on each step."""

import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from conftest import Env, make_home
from gitserver import GitServer, HTTPSServer

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

NAMES = ("stub.example.test", "other.example.test", "cred.example.test", "gql.example.test")
CURL = "curl -s -o /dev/null -w '%{http_code}\\n'"


def _ok(method, path, headers, body):
    return 200, {"Content-Type": "application/json"}, b'{"data": {}}'


class World:
    def __init__(self, env, git, stub):
        self.env, self.git, self.stub = env, git, stub

    def url(self, name="stub.example.test", path="/api/one"):
        return f"https://{name}:{self.stub.port}{path}"

    def posts(self):
        return [(q["headers"].get("host", "").split(":")[0], q["method"], q["path"])
                for q in self.stub.requests if q["method"] != "GET"]

    def steps(self):
        return json.loads(self.env.envgit("log", "--json", check=True).stdout)

    def grants(self, *extra):
        return json.loads(self.env.envgit("grants", "--json", *extra, check=True).stdout)


@pytest.fixture(name="world")
def grants_world(tmp_path):
    with GitServer(root=tmp_path / "git") as git, \
            HTTPSServer(_ok, NAMES, root=tmp_path / "stub", ca=git.ca) as stub:
        home = make_home(tmp_path)
        root = home / "proj"
        env = Env(home, root, {"ENVGIT_RESOLVE": f"{git.resolve},{stub.resolve}",
                               "ENVGIT_UPSTREAM_CA": str(git.ca.cert_path), "MY_TOKEN": "real-secret-1"})
        hp = f"git.example.test:{git.port}"
        subprocess.run(["git", "-c", f"http.curloptResolve={hp}:127.0.0.1", "clone", "-q", git.url, str(root)],
                       check=True, capture_output=True,
                       env={"PATH": env.env["PATH"], "HOME": str(home), "GIT_TERMINAL_PROMPT": "0",
                            "GIT_SSL_CAINFO": str(git.ca.cert_path)})
        for k, v in (("user.email", "a@example.test"), ("user.name", "a")):
            subprocess.run(["git", "-C", str(root), "config", k, v], check=True)
        env.envgit("init", check=True)
        allow = [hp] + [f"{n}:{stub.port}" for n in NAMES]
        env.write_policy(
            "version: 1\nnetwork:\n  ask_timeout: 15\n  allow: [" + ", ".join(f'"{h}"' for h in allow) + "]\n"
            "irreversible:\n  - preset: default\n  - rule: git-push\n    action: ask\n"
            "  - net: {host: \"*.example.test\", method: \"*\", path: \"/api/**\"}\n"
            "    action: ask\n    name: api-write\n"
            "  - net: {host: \"gql.example.test\", path: \"/graphql\"}\n    body: {graphql: mutation}\n"
            "    action: ask\n    name: gql-mutation\n"
            "credentials:\n  tok:\n    from: { env: MY_TOKEN }\n"
            f"    hosts: [\"cred.example.test:{stub.port}\"]\n")
        env.envgit("trust", "--yes", check=True)    # the person approves the credential
        try:
            yield World(env, git, stub)
        finally:
            env.stop()


class Person:
    """Another terminal: answers each new question with the argv `decide(question)` returns
    (["approve", "--remember"], ["deny"], …), keeps what it saw and the replies."""

    def __init__(self, env, decide):
        self.env, self.decide, self.seen, self.replies = env, decide, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)

    def _run(self):
        answered = set()
        while not self._stop.is_set():
            r = self.env.envgit("pending", "--json")
            try:
                asks = json.loads(r.stdout or "[]")
            except ValueError:
                asks = []
            for a in asks:
                if a["id"] in answered:
                    continue
                self.seen.append(a["question"])
                argv = self.decide(a["question"])
                r = self.env.envgit(*argv, str(a["id"]), "--json")
                self.replies.append((argv, r.returncode, r.stdout))
                if r.returncode == 0:
                    answered.add(a["id"])
            time.sleep(0.1)


def first_remembered(*extra):
    """Approve and remember the first question, deny every later one."""
    state = {"n": 0}

    def decide(q):
        state["n"] += 1
        return ["approve", "--remember", *extra] if state["n"] == 1 else ["deny"]
    return decide


def deny_all(q):
    return ["deny"]


def test_a_remembered_request_is_allowed_later_without_asking_and_nothing_else_is(world):
    w = world
    post = f"{CURL} -X POST --data-binary x"
    with Person(w.env, first_remembered()) as p:
        r = w.env.run(f"{post} {w.url()}")
    assert r.stdout.split() == ["200"], r.stdout + r.stderr
    assert len(p.seen) == 1 and p.replies[0][1] == 0, p.replies
    grant = json.loads(p.replies[0][2])["grant"]
    assert grant["id"] == "g1" and grant["scope"]["path"] == "/api/one" and grant["scope"]["method"] == "POST"
    # a later step (a new `envgit run`): the same request, no question; then outside the grant
    with Person(w.env, deny_all) as p2:
        r = w.env.run(f"{post} {w.url()}; {post.replace('POST', 'PUT')} {w.url()}; "
                      f"{post} {w.url(path='/api/two')}; {post} {w.url('other.example.test')}; "
                      f"{post} '{w.url(path='/api/one?force=1')}'; {post} {w.url(path='/API/one')}")
    assert r.stdout.split() == ["200", "403", "403", "403", "403", "403"], r.stdout + r.stderr
    assert [(q["method"], q["host"], q["path"]) for q in p2.seen] == [
        ("PUT", "stub.example.test", "/api/one"), ("POST", "stub.example.test", "/api/two"),
        ("POST", "other.example.test", "/api/one"), ("POST", "stub.example.test", "/api/one?force=REDACTED"),
        ("POST", "stub.example.test", "/API/one")], p2.seen
    assert w.posts() == [("stub.example.test", "POST", "/api/one")] * 2        # the oracle
    step = w.steps()[-1]
    used = [a for a in step["approvals"] if a.get("granted_by")]
    assert len(used) == 1 and used[0]["how"] == "grant" and used[0]["granted_by"] == "g1"
    assert used[0]["answer"] == "allow" and used[0]["ask"] is None
    assert any(q.get("answered_how") == "grant g1" and q["status"] == 200 for q in step["requests"])
    listed = w.grants()
    assert [(g["id"], g["uses"]) for g in listed] == [("g1", 1)]
    text = w.env.envgit("grants", check=True).stdout
    assert text.startswith("  g1  POST https://stub.example.test:") and "/api/one  uses 1  " in text, text


def test_revoke_and_expiry_end_a_grant_and_it_survives_a_daemon_restart(world):
    w = world
    post = f"{CURL} -X POST --data-binary x"
    with Person(w.env, first_remembered()):
        assert w.env.run(f"{post} {w.url()}").stdout.split() == ["200"]
    w.env.stop()                                           # a new daemon reads the grant back
    with Person(w.env, deny_all) as p:
        assert w.env.run(f"{post} {w.url()}").stdout.split() == ["200"]
        assert not p.seen
        r = w.env.envgit("grants", "revoke", "g1", "--json", check=True)
        assert json.loads(r.stdout)["revoked"]["who"]
        assert w.env.run(f"{post} {w.url()}").stdout.split() == ["403"]
        assert len(p.seen) == 1
    assert w.grants() == [] and w.grants("--all")[0]["revoked"]
    # a grant for 2 s: used at once, asked again once it has expired
    with Person(w.env, first_remembered("--for", "2s")) as p:
        assert w.env.run(f"{post} {w.url(path='/api/two')}").stdout.split() == ["200"]
        assert w.env.run(f"{post} {w.url(path='/api/two')}").stdout.split() == ["200"]
        assert len(p.seen) == 1
        time.sleep(2.5)
        assert w.env.run(f"{post} {w.url(path='/api/two')}").stdout.split() == ["403"]
        assert len(p.seen) == 2
    assert [g["id"] for g in w.grants("--all")] == ["g1", "g2"] and w.grants() == []
    assert w.posts().count(("stub.example.test", "POST", "/api/one")) == 2
    assert w.posts().count(("stub.example.test", "POST", "/api/two")) == 2


def test_a_grant_never_covers_a_credential_host(world):
    w = world
    post = f"{CURL} -X POST --data-binary x"
    tried = []

    def decide(q):                     # remember first; when that is refused, allow once
        tried.append(q)
        return ["approve", "--remember"] if len(tried) == 1 else ["approve"]
    with Person(w.env, decide) as p:
        r = w.env.run(f"{post} {w.url('cred.example.test')}")
    assert r.stdout.split() == ["200"], r.stdout + r.stderr
    refused = p.replies[0]
    assert refused[1] == 2 and "credential 'tok'" in json.loads(refused[2])["error"], p.replies
    assert w.grants("--all") == []
    # the daemon refuses the field however it is sent (the UI's path too)
    with Person(w.env, lambda q: ["approve", "--remember", "--path", "/api/**"]) as p:
        r = w.env.run(f"{post} {w.url('cred.example.test')}")
    assert r.stdout.split() == ["403"] and w.grants("--all") == []


def test_widening_is_explicit_recorded_and_judged_on_every_reading(world):
    w = world
    post = f"{CURL} -X POST --data-binary x"
    with Person(w.env, first_remembered("--path", "/api/*")) as p:
        assert w.env.run(f"{post} {w.url()}").stdout.split() == ["200"]
    g = w.grants()[0]
    assert g["scope"]["path_glob"] == "/api/*" and g["widened"]["path"] == "/api/*" and g["widened"]["who"]
    with Person(w.env, deny_all) as p:
        r = w.env.run(f"{post} {w.url(path='/api/two')}; {post} {w.url(path='/api/x/y')}; "
                      f"{post} --path-as-is '{w.url(path='/api/..%2fadmin')}'")
    assert r.stdout.split() == ["200", "403", "403"], r.stdout + r.stderr
    # one segment by its spelling, /admin as the server reads it: not inside the glob
    assert [q["path"] for q in p.seen] == ["/api/x/y", "/api/..%2fadmin"]
    # a widening must include what was asked, and only a request's path can be widened
    with Person(w.env, first_remembered("--path", "/other/*")) as p:
        assert w.env.run(f"{post} {w.url(path='/api/three/x')}").stdout.split() == ["403"]
    assert "does not cover the path asked" in json.loads(p.replies[0][2])["error"]


def test_a_push_grant_covers_the_next_push_of_that_ref_only(world):
    w = world
    with Person(w.env, first_remembered()) as p:
        r = w.env.run("echo a > a && git add a && git commit -qm a && git push -q origin main")
    assert r.returncode == 0, r.stderr
    g = w.grants()[0]["scope"]
    assert g["effect"] == "git-push" and g["refs"] == [{"ref": "refs/heads/main", "action": "update"}]
    other = w.git.projects / "other.git"                 # a second repository on the same host
    shutil.copytree(w.git.bare, other)
    before_other = subprocess.run(["git", "-C", str(other), "rev-parse", "main"], capture_output=True,
                                  text=True).stdout.strip()
    with Person(w.env, deny_all) as p:
        r = w.env.run("echo b > b && git add b && git commit -qm b && git push -q origin main; echo main=$?; "
                      "git push -q origin main:feature; echo feature=$?; "
                      f"git push -q {w.git.url.replace('repo.git', 'other.git')} main; echo other=$?")
    assert "main=0" in r.stdout and "feature=0" not in r.stdout and "other=0" not in r.stdout, r.stdout + r.stderr
    assert subprocess.run(["git", "-C", str(other), "rev-parse", "main"], capture_output=True,
                          text=True).stdout.strip() == before_other          # the other repository: untouched
    head = subprocess.run(["git", "-C", str(w.env.root), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    refs = w.git.refs()
    assert refs["refs/heads/main"] == head and "refs/heads/feature" not in refs       # the oracle
    assert [([r["ref"] for r in q["refs"]], q["repository"]) for q in p.seen] == [
        (["refs/heads/feature"], "/repo.git"), (["refs/heads/main"], "/other.git")]
    assert any(a.get("granted_by") == "g1" for a in w.steps()[-1]["approvals"])


def test_a_graphql_grant_covers_its_operation_only(world):
    w = world
    gql = f"{CURL} -H 'Content-Type: application/json' {w.url('gql.example.test', '/graphql')} --data-binary"
    star = json.dumps({"query": "mutation Star { addStar(input: {id: \"R1\"}) { ok } }"})
    delete = json.dumps({"query": "mutation Star { deleteRepository(input: {id: \"R1\"}) { ok } }"})
    with Person(w.env, first_remembered()):
        assert w.env.run(f"{gql} '{star}'").stdout.split() == ["200"]
    with Person(w.env, deny_all) as p:
        r = w.env.run(f"{gql} '{star}'; {gql} '{delete}'")
    assert r.stdout.split() == ["200", "403"], r.stdout + r.stderr
    bodies = [q["body"].decode() for q in w.stub.requests if q["path"] == "/graphql"]
    assert sum("addStar" in b for b in bodies) == 2 and not any("deleteRepository" in b for b in bodies)
    assert [q["operations"][0]["fields"] for q in p.seen] == [["deleteRepository"]]


def test_remember_needs_an_allow_and_a_pending_question(world):
    w = world
    r = w.env.envgit("approve", "7", "--for", "1h")
    assert r.returncode == 2 and "add --remember" in r.stderr
    r = w.env.envgit("approve", "7", "--remember", "--rule")
    assert r.returncode == 2 and "--rule" in r.stderr
    r = w.env.envgit("approve", "7", "--remember", "--for", "99d")
    assert r.returncode == 2 and "longer than a grant may last" in r.stderr
    r = w.env.envgit("grants", "revoke", "g9")
    assert r.returncode == 2 and "no grant 'g9'" in r.stderr


def test_m_at_the_terminal_of_envgit_run_remembers_and_a_credential_host_falls_back_to_once(world):
    """The person at the step's own terminal types m: allowed and remembered (the next step's
    identical request is let through by the grant, the server sees it twice); on a credential's
    host, where no grant may be made, m allows once and says why, and no grant exists."""
    w = world
    post = f"{CURL} -X POST --data-binary x"
    status, out = w.env.pty_run(["sh", "-c", f"{post} {w.url()}"], send=b"m\n", when=b"deny [N]?",
                                timeout=60)
    assert os.waitstatus_to_exitcode(status) == 0 and "200" in out, out
    assert [(g["id"], g["scope"]["path"]) for g in w.grants()] == [("g1", "/api/one")]
    with Person(w.env, deny_all) as p:
        r = w.env.run(f"{post} {w.url()}")
    assert r.stdout.split() == ["200"] and p.seen == [], r.stdout + r.stderr
    assert w.posts() == [("stub.example.test", "POST", "/api/one")] * 2
    status, out = w.env.pty_run(["sh", "-c", f"{post} {w.url('cred.example.test')}"], send=b"m\n",
                                when=b"deny [N]?", timeout=60)
    assert os.waitstatus_to_exitcode(status) == 0 and "200" in out, out
    assert [g["id"] for g in w.grants()] == ["g1"]
    how = w.steps()[-1]["approvals"][0]["how"]
    assert how.startswith("at the terminal of envgit run; not remembered:") and "credential" in how, how


def test_a_question_ends_with_its_step_and_cannot_be_answered_or_remembered_after(world):
    """A request a step left behind (curl in the background, the shell gone) asks; the step's
    end answers it deny by `step-ended`, recorded on the step; it is no longer pending, an
    answer (and a remember) sent then is refused with why, no grant is made, nothing reached
    the server."""
    w = world
    go = w.env.root / "go"

    def once_asked():       # the step ends once its request asks (a fixed `sleep 2` could end it
        end = time.monotonic() + 60     # first on a loaded machine, the gate still starting)
        while time.monotonic() < end and not json.loads(w.env.envgit("pending", "--json").stdout or "[]"):
            time.sleep(0.1)
        go.touch()
    t = threading.Thread(target=once_asked)
    t.start()
    r = w.env.run(f"{CURL} -X POST --data-binary late {w.url()} & "
                  "i=0; while [ ! -e go ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done; echo gone")
    t.join(90)
    assert "gone" in r.stdout, r.stdout + r.stderr
    assert json.loads(w.env.envgit("pending", "--json", check=True).stdout or "[]") == []
    step = json.loads(w.env.envgit("show", "last", "--json", check=True).stdout)
    ended = [a for a in step["approvals"] if a.get("who") == "step-ended"]
    assert len(ended) == 1 and ended[0]["answer"] == "deny", step["approvals"]
    assert [(q["method"], q.get("answer")) for q in step["requests"]] == [("POST", "deny")], step["requests"]
    for argv in (["approve", str(ended[0]["ask"])], ["approve", str(ended[0]["ask"]), "--remember"]):
        late = w.env.envgit(*argv)
        assert late.returncode != 0 and f"when its step {step['id']} ended" in late.stderr, late.stderr
    assert w.grants("--all") == [] and w.posts() == []


def test_at_the_terminal_a_new_question_does_not_take_an_answer_meant_for_the_last_one(world):
    """The step's terminal, as the page (ui.js): a step times its second question to land
    just before the person's "y" for the first; the prompt is re-written naming the question
    an answer goes to, and an allowing answer typed within a second of that change is not
    taken (it may have been meant for what was shown before); typed again later, it is."""
    from conftest import ENVGIT
    from ptydrive import Term
    w = world
    post = f"{CURL} -X POST --data-binary x"
    step = f"{post} {w.url()} & sleep 5; {post} {w.url(path='/api/two')} & wait"
    with Term([ENVGIT, "run", "--", "sh", "-c", step], w.env.root, w.env.env) as t:
        assert t.expect(b"question 1: allow once", timeout=60), t.text
        assert t.expect(b"envgit deny 2", timeout=30), t.text        # question 2, under the prompt
        assert t.expect(b"question 1: allow once", timeout=10), t.text   # the prompt, again, naming 1
        t.send(b"y\r", settle=0)
        assert t.expect(b"changed just now", timeout=10), t.text
        time.sleep(1.5)
        t.send(b"y\r")
        assert t.expect(b"question 2: allow once", timeout=20), t.text
        t.send(b"n\r")
        t.wait(60)
    assert w.posts() == [("stub.example.test", "POST", "/api/one")], (w.posts(), t.text)
