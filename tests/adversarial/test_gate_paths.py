"""Issue 10 class 14: path spellings a server may normalise must be judged as the server would
read them. The stub server here reads each path the way real servers do (percent-decoding,
twice behind a decoding proxy; `;params` dropped as Tomcat and Jetty do; `\\` as `/` and
trailing dots and spaces dropped as IIS does; `//`, `.` and `..` resolved; case ignored) and
writes a marker file for every request that reaches, in its reading, what the policy forbids.
The markers are the oracle; the plain spellings of the same requests are the legitimate use."""

import re
import shutil
from pathlib import Path
from urllib.parse import unquote

import pytest

from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

OLD, NEW = "1" * 40, "2" * 40


def pkt(s: bytes) -> bytes:
    return b"%04x" % (len(s) + 4) + s


PUSH = pkt(f"{OLD} {NEW} refs/heads/main\0report-status\n".encode()) + b"0000PACK"


def server_reading(path: str) -> str:
    """How a lenient server reads a path (independent of envgit's own reading)."""
    p = path.split("?")[0]
    for _ in range(2):
        p = unquote(p)
    p = p.replace("\\", "/")
    p = re.sub(r";[^/]*", "", p)
    out = []
    for seg in p.split("/"):
        seg = seg if seg in (".", "..") else seg.rstrip(". ")
        if seg == "..":
            if out:
                out.pop()
        elif seg not in ("", "."):
            out.append(seg)
    return ("/" + "/".join(out)).lower()


class Stub:
    def __init__(self, markers: Path):
        self.markers = markers

    def __call__(self, method, path, headers, body):
        seen = server_reading(path)
        if method == "POST" and seen.endswith("/git-receive-pack"):
            self._mark("push", path)
        if seen.startswith("/private"):
            self._mark("private", path)
        return 200, {"Content-Type": "text/plain"}, b"ok"

    def _mark(self, what, path):
        self.markers.mkdir(exist_ok=True)
        n = len(list(self.markers.iterdir()))
        (self.markers / f"{what}-{n}").write_text(path)

    def marks(self, what):
        return sorted(p.read_text() for p in self.markers.glob(f"{what}-*")) if self.markers.exists() else []


@pytest.fixture
def world(tmp_path):
    stub_app = Stub(tmp_path / "markers")
    with servers(stub_app) as (git, stub):
        yield git, stub, stub_app


CURL = "curl -s --max-time 20 --path-as-is -o /dev/null -w '%{http_code}\\n'"

PUSH_SPELLINGS = [
    "/r.git/git-receive-pack;x", "/r.git/git-receive-pack%3Bx", "/r.git/git-receive-pack.",
    "/r.git/git-receive-pack%20", "/r.git/git-receive-pack%2e", "/r.git%2Fgit-receive-pack",
    "/r.git/x/%2e%2e/git-receive-pack", "/r.git/x/..%3B/git-receive-pack", "/r.git//git-receive-pack",
    "/r.git/./git-receive-pack", "/r.git/x/../git-receive-pack", "/R.GIT/GIT-RECEIVE-PACK",
    "/r.git%5Cgit-receive-pack", "/r.git/git%252Dreceive-pack", "/r.git/git-receive-pack/",
]


def test_push_spellings_are_judged_as_the_server_reads_them(attacker, world):
    git, stub, app = world
    netproject(attacker, git, stub, "irreversible:\n  - preset: default\n")
    (attacker.root / "push.bin").write_bytes(PUSH)
    attacker.own(attacker.root / "push.bin")
    base = f"https://{hostport(stub, 'stub.example.test')}"
    post = f"{CURL} -X POST -H 'Content-Type: application/x-git-receive-pack-request' --data-binary @push.bin"
    script = "".join(f"{post} '{base}{p}'\n" for p in PUSH_SPELLINGS)
    legit = (f"{CURL} '{base}/r.git/info/refs?service=git-receive-pack'\n"
             f"{CURL} -X POST --data-binary @push.bin '{base}/r.git/git-upload-pack'\n")
    r = attacker.run(script + legit, timeout=180)
    assert app.marks("push") == [], app.marks("push")                       # the oracle
    assert r.stdout.split()[-2:] == ["200", "200"], r.stdout + r.stderr       # fetches go through
    reached = [q["path"] for q in stub.requests]
    assert reached == ["/r.git/info/refs?service=git-receive-pack", "/r.git/git-upload-pack"], reached


ALLOW_LIST = ("  l7:\n    gql.example.test: {methods: [GET], paths: [\"/public/**\"]}\n"
              "irreversible:\n  - preset: default\n")

ESCAPES = [
    "/public/..;/private/secret", "/public/%2e%2e/private/secret", "/public%2F..%2Fprivate/secret",
    "/public/%252e%252e/private/secret", "/public%5C..%5Cprivate%5Csecret",
    "/public/x/../../private/secret", "/public/..%3B/private/secret", "/public/.%2e/private/secret",
    "/PUBLIC/../Private/secret",
]
AMBIGUOUS = ["/public/a%00b", "/../private/secret", "/public/%2e%2e/%2e%2e/private", "/public/a%0d%0ab"]


def test_an_allow_list_is_not_left_by_a_spelling(attacker, world):
    git, stub, app = world
    netproject(attacker, git, stub, ALLOW_LIST)
    base = f"https://{hostport(stub, 'gql.example.test')}"
    script = "".join(f"{CURL} '{base}{p}'\n" for p in ESCAPES + AMBIGUOUS)
    r = attacker.run(script + f"{CURL} '{base}/public/readme'\n{CURL} '{base}/public/a;v=1'\n", timeout=180)
    codes = r.stdout.split()
    assert app.marks("private") == [], app.marks("private")                 # the oracle
    assert codes[:-2] == ["403"] * (len(ESCAPES) + len(AMBIGUOUS)), \
        (dict(zip(ESCAPES + AMBIGUOUS, codes, strict=False)), r.stderr)
    assert codes[-2:] == ["200", "200"], r.stdout + r.stderr
    assert [q["path"] for q in stub.requests] == ["/public/readme", "/public/a;v=1"]
