"""Issue 10 class 5: one "allow once" must cover exactly the effect that was shown, nothing
else in the same step. The oracle is the server's own state: the git server's refs after the
push, the stub server's record of the requests that reached it.

Each attack is one step (one `envgit run`) that first does what a person approves, then
something else under the same rule; the person (another terminal, `envgit approve/deny`)
approves only what it was shown first. Last, a question must not outlive its step (red team,
round 14)."""

import json
import shutil
import time

import pytest

from gatekit import Answerer, clone_into_project, hostport, netproject, refs_of

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

ASK_PUSH = "irreversible:\n  - preset: default\n  - rule: git-push\n    action: ask\n"


def approves_the_first_only():
    """A person who approves the first question shown and denies every later one: (the
    answering function for Answerer, the dict that receives the first question)."""
    first = {}

    def person(q):
        if not first:
            first.update(q)
            return "approve"
        return "deny"
    return person, first


def test_approved_push_does_not_cover_a_force_push_or_a_delete(attacker, gate_servers):
    git, stub = gate_servers
    netproject(attacker, git, stub, ASK_PUSH)
    clone_into_project(attacker, git)
    main_before = git.refs()["refs/heads/main"]
    person, first = approves_the_first_only()

    script = (
        "git checkout -q -b feature && echo f > f && git add f && git commit -qm f && "
        "git push -q origin feature; echo push1=$?; "
        # the same step, the same rule, the same repository: a force push over main …
        "git checkout -q --orphan evil && git rm -qrf . && echo evil > evil && git add evil && "
        "git commit -qm evil && git push -q --force origin evil:main; echo push2=$?; "
        # … and a delete of the branch the person just approved
        "git push -q origin :feature; echo push3=$?")
    with Answerer(attacker, person) as a:
        r = attacker.run(script, timeout=180)
    refs = git.refs()
    assert refs["refs/heads/main"] == main_before, (r.stdout, r.stderr)       # the oracle
    assert "refs/heads/feature" in refs, (r.stdout, r.stderr)                  # approved, landed
    assert "push1=0" in r.stdout and "push2=0" not in r.stdout and "push3=0" not in r.stdout
    assert refs_of(first) == ["refs/heads/feature"] and first["refs"][0]["action"] == "create"
    # each was asked on its own, shown with its own ref update
    asked = [refs_of(q) for q in a.seen]
    assert ["refs/heads/main"] in asked and ["refs/heads/feature"] in asked[1:], asked
    deleted = [q for q in a.seen[1:] if refs_of(q) == ["refs/heads/feature"]]
    assert deleted and deleted[0]["refs"][0]["action"] == "delete"


def test_the_same_push_again_is_covered_but_a_new_commit_is_not(attacker, gate_servers):
    """Approval is for old -> new exactly: pushing more commits to the approved branch is a new
    effect and is asked again."""
    git, stub = gate_servers
    netproject(attacker, git, stub, ASK_PUSH)
    clone_into_project(attacker, git)
    person, first = approves_the_first_only()

    script = ("echo a > a && git add a && git commit -qm a && git push -q origin main; echo push1=$?; "
              "echo b > b && git add b && git commit -qm b && git push -q origin main; echo push2=$?")
    with Answerer(attacker, person) as a:
        r = attacker.run(script, timeout=180)
    assert "refs" in first, (a.seen, r.stdout, r.stderr)
    head_after_first = first["refs"][0]["new"]
    assert git.refs()["refs/heads/main"] == head_after_first, (r.stdout, r.stderr)
    assert "push1=0" in r.stdout and "push2=0" not in r.stdout
    assert len(a.seen) == 2 and a.seen[1]["refs"][0]["old"] == head_after_first


def _gql(doc):
    return json.dumps({"query": doc})


def test_approved_graphql_mutation_does_not_cover_another(attacker, gate_servers):
    git, stub = gate_servers
    gql = hostport(stub, "gql.example.test")
    netproject(attacker, git, stub,
               "irreversible:\n  - preset: default\n"
               "  - net: {host: \"gql.example.test\", path: \"/graphql\"}\n"
               "    body: {graphql: mutation}\n    action: ask\n    name: gql-mutation\n")
    person, first = approves_the_first_only()

    star = _gql("mutation Star { addStar(input: {starrableId: \"R1\"}) { clientMutationId } }")
    delete = _gql("mutation Star { deleteRepository(input: {repositoryId: \"R1\"}) { clientMutationId } }")
    curl = f"curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'Content-Type: application/json' https://{gql}/graphql"
    script = (f"{curl} --data-binary '{star}'; {curl} --data-binary '{star}'; "
              f"{curl} --data-binary '{delete}'")
    with Answerer(attacker, person) as a:
        r = attacker.run(script, timeout=120)
    bodies = [q["body"].decode() for q in stub.requests if q["path"] == "/graphql"]
    assert not any("deleteRepository" in b for b in bodies), bodies        # the oracle
    assert sum("addStar" in b for b in bodies) == 2, bodies                # approved once, sent twice
    assert r.stdout.split() == ["200", "200", "403"], r.stdout + r.stderr
    assert first["operations"] == [{"type": "mutation", "name": "Star", "fields": ["addStar"]}]
    assert first["kind"] == "gql-mutation: mutation Star { addStar }"       # what the prompt prints
    assert len(a.seen) == 2 and a.seen[1]["operations"][0]["fields"] == ["deleteRepository"]


def test_approved_request_does_not_cover_another_path_or_query(attacker, gate_servers):
    git, stub = gate_servers
    api = hostport(stub, "stub.example.test")
    netproject(attacker, git, stub,
               "irreversible:\n  - net: {host: \"stub.example.test\", method: POST, path: \"/api/**\"}\n"
               "    action: ask\n    name: stub-write\n")
    person, first = approves_the_first_only()

    curl = "curl -s -o /dev/null -w '%{http_code}\\n' -X POST --data-binary x"
    script = (f"{curl} https://{api}/api/one; {curl} https://{api}/api/one; "
              f"{curl} https://{api}/api/two; {curl} 'https://{api}/api/one?force=1'")
    with Answerer(attacker, person):
        r = attacker.run(script, timeout=120)
    reached = [q["path"] for q in stub.requests if q["method"] == "POST"]
    assert reached == ["/api/one", "/api/one"], reached                    # the oracle
    assert r.stdout.split() == ["200", "200", "403", "403"], r.stdout + r.stderr
    assert first["covers"]["allow"].startswith("this request's effect only")


# --- a question outliving its step -------------------------------------------------------

ASK_API = ("irreversible:\n  - net: {host: \"*.example.test\", method: \"*\", path: \"/api/**\"}\n"
           "    action: ask\n    name: api-write\n")


def test_a_question_does_not_outlive_its_step(attacker, gate_servers):
    """The red team's case (round 14): a step sends a request the policy asks about and exits
    at once (curl in the background, the shell not waiting). The step ended, its snapshot was
    taken and its marks written (none: no `asked`); the question stayed in `envgit pending` and
    on the page, under the step's command, for the whole ask_timeout, with its Allow / Allow and
    remember buttons. A person answering it answered for a step that was over: the answer was
    recorded on that step as an allow after its end (the request record said `answer: allow`)
    although nothing could go out any more (mitmproxy drops the flow whose client left:
    checked, no POST reached the server), and "remember" made a grant from it. A step could so
    fill the page with stale questions that looked live, and the person's answer and the record
    disagreed with what happened. Oracle: the daemon's pending list after the step's end, and
    the server's record."""
    git, stub = gate_servers
    netproject(attacker, git, stub, ASK_API)
    api = hostport(stub, "stub.example.test")
    r = attacker.run(f"curl -s -o /dev/null -X POST --data-binary late https://{api}/api/one & sleep 2; "
                     "echo gone", timeout=120)
    assert "gone" in r.stdout, r.stdout + r.stderr
    ended = json.loads(attacker.envgit("show", "last", "--json", check=True).stdout)
    assert ended["status"] != "running", ended["status"]
    time.sleep(1)
    pending = json.loads(attacker.envgit("pending", "--json").stdout or "[]")
    for a in pending:                       # a person answering what the page shows
        attacker.envgit("approve", str(a["id"]))
    time.sleep(3)
    posts = [q for q in stub.requests if q["method"] == "POST"]
    step = json.loads(attacker.envgit("show", str(ended["id"]), "--json", check=True).stdout)
    assert not pending and not posts, (
        f"step {ended['id']} ended ({ended['status']}, marks {ended['marks']}) but its question "
        f"stayed pending ({[(a['id'], a['step']) for a in pending]}); answered, it let "
        f"{len(posts)} POST(s) reach the server after the step was over; the step's marks now: "
        f"{step['marks']}, requests: {[(q['method'], q.get('decision'), q.get('answer')) for q in step['requests']]}")
