"""Red team, round 14: a step's question outlives the step.

A step sends a request the policy asks about and exits at once (curl in the background, the
shell not waiting). The step ends, its snapshot is taken and its marks are written (none:
no `asked`); the question stays in `envgit pending` and on the page, under the step's
command, for the whole ask_timeout, with its Allow / Allow and remember buttons. A person
answering it answers for a step that is over: the answer is recorded on that step as an
allow after its end (the request record says `answer: allow`) although nothing can go out
any more (mitmproxy drops the flow whose client left: checked, no POST reached the server),
and "remember" makes a grant from it. A step can so fill the page with stale questions that
look live, and the person's answer and the record disagree with what happened.

Oracle: the daemon's pending list after the step's end, and the server's record."""


import json
import shutil
import time

import pytest

from gatekit import hostport, netproject, servers
from harness import attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

ASK_API = ("irreversible:\n  - net: {host: \"*.example.test\", method: \"*\", path: \"/api/**\"}\n"
           "    action: ask\n    name: api-write\n")


@pytest.fixture
def world():
    with servers() as (git, stub):
        yield git, stub


def test_a_question_does_not_outlive_its_step(attacker, world):
    git, stub = world
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
