"""Issue 10 class 11 (GraphQL in every field that carries it) and class 14 (request bodies
buffered without a cap; WebSocket after an upgrade): attacks from inside a step through the
real gate, with the stub server's record of what reached it as the oracle (and, for memory,
the daemon's own peak resident size)."""

import json
import os
import shutil
import time
import zlib
from urllib.parse import quote

import pytest

from gatekit import Answerer, clone_into_project, hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

MARK = "addStar"                              # in every mutation below, in no query
Q = "{ viewer { login } }"
M = "mutation { addStar(input: {starrableId: \"R\"}) { clientMutationId } }"
CURL = "curl -s -o /dev/null -w '%{http_code}\\n'"


def app(method, path, headers, body):
    if headers.get("upgrade", "").lower() == "websocket":
        return 101, {"Upgrade": "websocket", "Connection": "Upgrade",
                     "Sec-WebSocket-Accept": "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="}, b""
    return 200, {"Content-Type": "application/json"}, b'{"data": {}}'


@pytest.fixture
def world():
    with servers(app) as (git, stub):
        yield git, stub


def reached(stub, text):
    return [q for q in stub.requests if text in q["path"] or text.encode() in q["body"]]


def form(*pairs):
    return "&".join(f"{k}={quote(v, safe='')}" for k, v in pairs)


def test_graphql_in_every_field_is_judged(attacker, world):
    git, stub = world
    netproject(attacker, git, stub, "irreversible:\n  - preset: default\n")
    gql = f"https://{hostport(stub, 'api.github.com')}/graphql"
    F = "-H 'Content-Type: application/x-www-form-urlencoded'"
    J = "-H 'Content-Type: application/json'"
    attacks = {
        "form, mutation last (Rack runs it)": f"{F} --data-binary '{form(('query', Q), ('query', M))}' {gql}",
        "form, mutation first": f"{F} --data-binary '{form(('query', M), ('query', Q))}' {gql}",
        "query string, twice": f"'{gql}?{form(('query', Q), ('query', M))}'",
        "form, ; as separator": f"{F} --data-binary 'x=1;{form(('query', M))}' {gql}",
        "URL and body": f"{F} --data-binary '{form(('query', Q))}' '{gql}?{form(('query', M))}'",
        "JSON, the key twice": f"{J} --data-binary '{{\"query\": \"{Q}\", \"query\": {json.dumps(M)}}}' {gql}",
        "JSON batch": f"{J} --data-binary '{json.dumps([{'query': Q}, {'query': M}])}' {gql}",
        "nested form key": f"{F} --data-binary '{form(('query[]', M))}' {gql}",
        "two types": f"-H 'Content-Type: application/json, application/x-www-form-urlencoded' "
                     f"--data-binary '{form(('query', M))}' {gql}",
        "multipart": f"-F 'query={M}' {gql}",
    }
    script = "".join(f"{CURL} {a}\n" for a in attacks.values())
    legit = (f"{CURL} {F} --data-binary '{form(('query', Q))}' {gql}\n"
             f"{CURL} {J} --data-binary '{json.dumps({'query': Q})}' {gql}\n")
    r = attacker.run(script + legit, timeout=120)
    codes = r.stdout.split()
    assert not reached(stub, MARK), [(q["path"], q["body"][:200]) for q in reached(stub, MARK)]   # the oracle
    assert codes[:len(attacks)] == ["403"] * len(attacks), dict(zip(attacks, codes, strict=False))
    assert codes[len(attacks):] == ["200", "200"], r.stdout + r.stderr
    assert len(reached(stub, "viewer")) == 2


def _daemon_pid(attacker):
    return json.loads(attacker.envgit("daemon", "status", check=True).stdout)["pid"]


def _reset_peak(pid):
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")                                # peak RSS := current RSS


def _peak_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))


MIB = 1 << 20
BIG = 128 * MIB


def test_a_large_body_costs_the_daemon_one_buffer_not_its_size(attacker, world):
    git, stub = world
    netproject(attacker, git, stub, "irreversible:\n  - preset: default\n")
    up = f"https://{hostport(stub, 'stub.example.test')}/upload"
    assert attacker.run(f"{CURL} {up}").stdout.strip() == "200"          # the gate is up
    pid = _daemon_pid(attacker)
    if os.geteuid() != 0 and attacker.user:
        pytest.skip("resetting the daemon's peak needs its owner")
    _reset_peak(pid)
    base = _rss_kib(pid)
    r = attacker.run(f"head -c {BIG} /dev/zero | {CURL} --data-binary @- {up}; "
                     f"head -c {BIG} /dev/zero | {CURL} -T - -X POST {up}", timeout=300)
    assert r.stdout.split() == ["200", "200"], r.stdout + r.stderr
    sizes = [len(q["body"]) for q in stub.requests if q["path"] == "/upload" and q["body"]]
    assert sizes == [BIG, BIG]                                            # all of it arrived
    grew = (_peak_kib(pid) - base) * 1024
    assert grew < 48 * MIB, f"the daemon grew by {grew / MIB:.0f} MiB for a {BIG // MIB} MiB body"


def test_a_body_still_being_sent_waits_in_the_kernel_while_a_person_decides(attacker, world):
    git, stub = world
    netproject(attacker, git, stub, "irreversible:\n  - net: {host: \"stub.example.test\", method: POST, "
               "path: \"/api/**\"}\n    action: ask\n    name: stub-write\n")
    up = f"https://{hostport(stub, 'stub.example.test')}"
    assert attacker.run(f"{CURL} {up}/warm").stdout.strip() == "200"
    pid = _daemon_pid(attacker)
    _reset_peak(pid)
    base = _rss_kib(pid)

    def slow_person(q):
        time.sleep(4)                      # the client goes on sending meanwhile
        return "approve"
    with Answerer(attacker, slow_person):
        r = attacker.run(f"head -c {BIG} /dev/zero | {CURL} -T - -X POST {up}/api/blob", timeout=300)
    assert r.stdout.split() == ["200"], r.stdout + r.stderr
    assert [len(q["body"]) for q in stub.requests if q["path"] == "/api/blob"] == [BIG]
    grew = (_peak_kib(pid) - base) * 1024
    assert grew < 48 * MIB, f"the daemon grew by {grew / MIB:.0f} MiB while the question waited"


def test_what_a_rule_needs_past_the_cap_is_doubt(attacker, world):
    git, stub = world
    netproject(attacker, git, stub, "irreversible:\n  - preset: default\n")
    gql = f"https://{hostport(stub, 'api.github.com')}/graphql"
    up = f"https://{hostport(stub, 'stub.example.test')}"
    # a mutation after 2 MiB of padding; a gzip body that inflates to 256 MiB
    (attacker.root / "padded.json").write_text(json.dumps({"pad": "x" * (2 * MIB), "query": M}))
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(z.compress(b"\0" * MIB) for _ in range(256)) + z.flush()
    (attacker.root / "bomb.gz").write_bytes(bomb)
    (attacker.root / "big.json").write_text(json.dumps({"data": "z" * (2 * MIB)}))
    attacker.own(*(attacker.root / n for n in ("padded.json", "bomb.gz", "big.json")))
    J = "-H 'Content-Type: application/json'"
    r = attacker.run(
        f"{CURL} {J} --data-binary @padded.json {gql}\n"
        f"{CURL} {J} -H 'Content-Encoding: gzip' --data-binary @bomb.gz {gql}\n"
        f"{CURL} {J} --data-binary @big.json {up}/api/data\n", timeout=180)
    assert not reached(stub, MARK), "a judged-unreadable body reached the server"
    assert not [q for q in stub.requests if q["path"] == "/graphql"]                     # the oracle
    assert r.stdout.split() == ["403", "403", "200"], r.stdout + r.stderr
    sent = (attacker.root / "big.json").stat().st_size
    assert [len(q["body"]) for q in stub.requests if q["path"] == "/api/data"] == [sent]


def _upload(field_last: bool, size=2 * MIB, b="BOUNDARY"):
    """A PyPI-style multipart upload, its :action field before or after a `size` file part."""
    action = f"--{b}\r\nContent-Disposition: form-data; name=\":action\"\r\n\r\nfile_upload\r\n"
    content = (f"--{b}\r\nContent-Disposition: form-data; name=\"content\"; filename=\"x.tar.gz\"\r\n\r\n"
               + "y" * size + "\r\n")
    return ((content + action) if field_last else (action + content)) + f"--{b}--\r\n"


def test_a_pypi_upload_hidden_past_the_cap_is_cut_off_before_it_completes(attacker, world):
    git, stub = world
    netproject(attacker, git, stub, "irreversible:\n  - preset: default\n")
    up = f"https://{hostport(stub, 'stub.example.test')}"
    (attacker.root / "last.multipart").write_text(_upload(field_last=True))
    (attacker.root / "first.multipart").write_text(_upload(field_last=False))
    (attacker.root / "plain.multipart").write_text(_upload(field_last=True).replace("file_upload", "file_other"))
    attacker.own(*(attacker.root / n for n in ("last.multipart", "first.multipart", "plain.multipart")))
    T = "-H 'Content-Type: multipart/form-data; boundary=BOUNDARY'"
    r = attacker.run(
        f"{CURL} {T} --data-binary @last.multipart {up}/legacy/\n"
        f"{CURL} {T} -X POST -T last.multipart {up}/legacy/\n"          # chunked
        f"{CURL} {T} --data-binary @first.multipart {up}/legacy/\n"
        f"{CURL} {T} --data-binary @plain.multipart {up}/upload/\n", timeout=180)
    got = [q for q in stub.requests if q["path"] == "/legacy/"]
    # the oracle: no upload reached the server whole (the markers never arrived together)
    assert not [q for q in got if b":action" in q["body"] and b"file_upload" in q["body"]], \
        [len(q["body"]) for q in got]
    assert r.stdout.split()[2:] == ["403", "200"], r.stdout + r.stderr
    assert r.stdout.split()[:2] != ["200", "200"], r.stdout + r.stderr
    assert [len(q["body"]) for q in stub.requests if q["path"] == "/upload/"] == \
        [(attacker.root / "plain.multipart").stat().st_size]                 # the legitimate one, whole


def test_a_big_approved_push_is_streamed_and_lands(attacker, world):
    """Past the cap, asked about on its first MiB (the ref update is there), held while the
    person answers, then streamed on whole."""
    git, stub = world
    netproject(attacker, git, stub, "irreversible:\n  - preset: default\n  - rule: git-push\n    action: ask\n")
    clone_into_project(attacker, git)
    with Answerer(attacker, lambda q: "approve") as a:
        r = attacker.run("head -c 3000000 /dev/urandom > blob && git add blob && git commit -qm blob && "
                         "git push -q origin main && git rev-parse HEAD", timeout=180)
    assert r.returncode == 0, r.stderr
    assert git.refs()["refs/heads/main"] == r.stdout.split()[-1]             # the oracle
    assert [q["refs"][0]["new"] for q in a.seen] == [r.stdout.split()[-1]]    # asked once, on the refs


def test_websocket_upgrades_refused_on_judged_hosts_unless_allowed(attacker, world):
    git, stub = world
    ws = f"https://{hostport(stub, 'stub.example.test')}/socket"
    upgrade = ("-H 'Connection: Upgrade' -H 'Upgrade: websocket' -H 'Sec-WebSocket-Version: 13' "
               "-H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' --max-time 5")
    netproject(attacker, git, stub, "irreversible:\n  - preset: default\n")
    r = attacker.run(f"{CURL} {upgrade} {ws}")
    assert r.stdout.strip() == "403", r.stdout + r.stderr
    assert not [q for q in stub.requests if q["path"] == "/socket"]           # the oracle
    netproject(attacker, git, stub, "  l7:\n    stub.example.test: {websocket: allow}\n"
               "irreversible:\n  - preset: default\n")
    r = attacker.run(f"{CURL} {upgrade} {ws}")
    assert [q["headers"].get("upgrade") for q in stub.requests if q["path"] == "/socket"] == ["websocket"]
