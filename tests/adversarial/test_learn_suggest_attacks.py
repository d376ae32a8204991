"""Learn mode and `envgit policy suggest` attacked from inside a step (issue 28, second look):
what a step sends is what the journal records, and what the journal records is what suggest
turns into envgit.yaml lines. The oracles: what reached the local servers (the stub's request
log, the git server's refs), the journal, and whether the commands finish cleanly.

Found open by an attacker, closed now: a refused CONNECT's Host header is not
recorded as its host (no wildcard `*.com` suggested); a path byte that is not UTF-8 is on the
record and asked about with no traceback; `envgit learn off` ends learn mode for a running step
too. Holding: push, LFS and GraphQL spellings, pipelining and a tunnel in a tunnel, a process
left behind; suggest never reads a recorded method `*` or path `/**` as a pattern, gives a new
host its l7 rule though a key names the host on another port, is not stopped by a method NULL,
and finishes with no traceback on a path `//[` or of many `*`. Runs as root, and as
a user where the uid could matter."""

import json
import shutil
import subprocess
import time

import pytest

from conftest import ENVGIT
from gatekit import hostport
from harness import every_case, put_back
from kit.tunnel import TUNNEL

pytestmark = [pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")]


def project(attacker, git, stub, allow=(), l7=""):
    """The attacker's project: the git server and `allow` in network.allow, `l7` lines under
    network.l7, the default irreversible preset; the servers' names mapped to 127.0.0.1."""
    attacker.stop()
    attacker.env["ENVGIT_RESOLVE"] = ",".join(f"{n}=127.0.0.1" for n in git.names + stub.names)
    attacker.env["ENVGIT_UPSTREAM_CA"] = str(git.ca.cert_path)
    hosts = ", ".join(f'"{h}"' for h in (hostport(git), *allow))
    attacker.write_policy(f"version: 1\nnetwork:\n  allow: [{hosts}]\n  ask_timeout: 5\n" +
                          (f"  l7:\n{l7}" if l7 else "") + "irreversible:\n  - preset: default\n")


def reached(stub, needle):
    """The requests of `stub` (the server, or a list of its requests) whose path holds `needle`."""
    return [r for r in getattr(stub, "requests", stub) if needle in r["path"]]


def curl(*args):
    """A curl command line for a step's script: the status code printed, never failing it."""
    return "curl -sS -o /dev/null -w '%{http_code}\\n' " + " ".join(args) + " || true\n"


# --- suggest: what a step sends must not become a wider line than it needed -----------------

@pytest.mark.both_uids("the record is the gate's, which runs as the person; shown as both")
def test_a_refused_tunnels_host_header_is_not_what_suggest_allows(attacker, gate_servers):
    git, stub = gate_servers
    project(attacker, git, stub)
    # the tunnel asked for is nowhere.example.test; its Host header names a wildcard
    r = attacker.run(curl("--proxy-header 'Host: *.com'", f"https://nowhere.example.test:{stub.port}/"))
    assert r.stdout.split() == ["000"], r.stdout + r.stderr          # refused: no tunnel
    sug = attacker.envgit("policy", "suggest", "--apply")
    # gitlab.com, a name no step asked for (mapped to the stub, as the servers' names are)
    attacker.run(curl(f"https://{hostport(stub, 'gitlab.com')}/canary-never-asked-for"))
    assert not reached(stub, "canary-never-asked-for"), (sug.stdout, stub.requests)


def test_glob_characters_a_step_sent_do_not_widen_an_l7_rule(attacker, gate_servers):
    git, stub = gate_servers
    st = hostport(stub, "stub.example.test")
    project(attacker, git, stub, allow=[st],
            l7=f'    "{st}": {{ methods: [GET], paths: ["/public/**"] }}\n')
    u = f"https://{st}"
    r = attacker.run(curl("-X '*'", f"{u}/public/x") + curl("--path-as-is", f"'{u}/**'"))
    assert r.stdout.split() == ["403", "403"], r.stdout + r.stderr
    sug = attacker.envgit("policy", "suggest", "--apply")
    assert sug.returncode == 0, sug.stdout + sug.stderr
    attacker.run(curl("-X DELETE", f"{u}/private/canary-after-apply"))
    assert not reached(stub, "canary-after-apply"), (sug.stdout, stub.requests)


def test_glob_characters_in_learn_mode_do_not_narrow_a_new_host_to_everything(attacker, gate_servers):
    git, stub = gate_servers
    project(attacker, git, stub)
    u = f"https://{hostport(stub, 'stub.example.test')}"
    r = attacker.envgit("learn", "--", "sh", "-c", curl("-X '*'", f"{u}/x") + curl("--path-as-is", f"'{u}/**'"))
    assert "403" not in r.stdout.split(), r.stdout + r.stderr      # learn mode let both through
    sug = attacker.envgit("policy", "suggest", "--apply")
    assert sug.returncode == 0, sug.stdout + sug.stderr
    attacker.run(curl("-X DELETE", f"{u}/private/canary-after-apply"))
    assert not reached(stub, "canary-after-apply"), (sug.stdout, stub.requests)


def test_a_new_hosts_l7_rule_is_not_skipped_for_a_key_on_another_port(attacker, gate_servers):
    git, stub = gate_servers
    project(attacker, git, stub, l7='    "stub.example.test:8443": { methods: [GET] }\n')
    u = f"https://{hostport(stub, 'stub.example.test')}"
    attacker.envgit("learn", "--", "sh", "-c", curl(f"{u}/read"), check=True)
    assert reached(stub, "/read"), stub.requests
    sug = attacker.envgit("policy", "suggest", "--apply")
    assert sug.returncode == 0, sug.stdout + sug.stderr
    attacker.run(curl("-X DELETE", f"{u}/private/canary-after-apply"))
    assert not reached(stub, "canary-after-apply"), (sug.stdout, stub.requests)


def test_an_odd_method_learn_mode_let_through_does_not_stop_suggest(attacker, gate_servers):
    git, stub = gate_servers
    project(attacker, git, stub)
    u = f"https://{hostport(stub, 'stub.example.test')}"
    r = attacker.envgit("learn", "--", "sh", "-c", curl(f"{u}/read") + curl("-X NULL", f"{u}/odd"),
                        check=True)
    # learn mode let both through: the stub answers a method it has no handler for itself (501,
    # before its request log), where the gate would have refused with 403
    assert r.stdout.split() == ["200", "501"] and reached(stub, "/read"), r.stdout + r.stderr
    sug = attacker.envgit("policy", "suggest")
    assert sug.returncode == 0 and "stub.example.test" in sug.stdout, sug.stdout + sug.stderr


# --- hostile records: suggest, stats and the page finish, with no traceback ------------------

def test_suggest_on_a_path_urlsplit_refuses_prints_no_traceback(attacker, gate_servers):
    git, stub = gate_servers
    project(attacker, git, stub)
    u = f"https://{hostport(stub, 'stub.example.test')}"
    attacker.envgit("learn", "--", "sh", "-c", curl("-g --path-as-is", f"'{u}//['"), check=True)
    assert reached(stub, "["), stub.requests            # learn mode let it through, and recorded it
    sug = attacker.envgit("policy", "suggest")
    assert "Traceback" not in sug.stderr and sug.returncode in (0, 1, 2), sug.stderr


STARS = "*" * 24 + "!"


def test_suggest_and_stats_finish_on_a_path_of_stars(attacker, gate_servers):
    git, stub = gate_servers
    st = hostport(stub, "stub.example.test")
    project(attacker, git, stub, allow=[st], l7=f'    "{st}": {{ methods: [GET], paths: ["/public/**"] }}\n')
    u = f"https://{st}"
    r = attacker.run(curl("--path-as-is", f"'{u}/{STARS}'") + curl(f"{u}/{'a' * 64}"))
    assert r.stdout.split() == ["403", "403"], r.stdout + r.stderr
    hung = []
    # A pattern of 24 stars that backtracks never ends; 30 s, not 5: a CLI's start alone takes
    # seconds when six workers load two cores
    for args in (("stats",), ("policy", "suggest")):
        try:
            done = attacker.envgit(*args, timeout=30)
            assert "Traceback" not in done.stderr, done.stderr
        except subprocess.TimeoutExpired:
            hung.append(" ".join(args))
    assert not hung, f"still running after 30 s: envgit {', envgit '.join(hung)}"


# A raw request whose target holds bytes that are not UTF-8 (mitmproxy hands the path on with
# them as lone surrogates): argv[2] is the request line's target, argv[3] "push" sends a push.
RAW = TUNNEL + r'''
target = sys.argv[2].encode().replace(b"@FF@", b"\xff")
body = open("/tmp/push", "rb").read() if sys.argv[3:] == ["push"] else b""
t.sendall(b"POST " + target + b" HTTP/1.1\r\nHost: " + f"{host}:{port}".encode() +
          b"\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
t.settimeout(5)
try:
    while t.recv(65536):
        pass
except OSError:
    pass
'''


# --- learn mode: an irreversible action by another spelling, on a host only learn mode lets in --

SPELLINGS = r'''
printf '@PUSH@' > /tmp/push
post() { curl -sS -o /dev/null -w "%{http_code} $2\n" -X POST --data-binary @/tmp/push "$@" || true; }
curl -sS -o /dev/null -w '%{http_code} control\n' @STUB@/control-read || true
for p in /r.git/GIT-RECEIVE-PACK /r.git/git%2Dreceive-pack //r.git//git-receive-pack \
         '/r.git/git-receive-pack;x=1' /r.git/git-receive-pack/ /r.git/./git-receive-pack \
         /r.git/git-receive-pack%3Bx /r.git/git-receive-pack%00.txt; do
  post --path-as-is "@STUB@$p"
done
post --http2 @STUB@/h2/r.git/git-receive-pack
post -H 'X-Rewrite-URL: /r.git/git-receive-pack' @STUB@/rewritten
post -H 'Content-Type: application/vnd.git-lfs+json' --data-binary '{"operation": "upload", "objects": []}' \
  @STUB@/lfs/r.git/info/lfs/objects/batch
M='mutation { deleteRepository(input: {}) { clientMutationId } }'
curl -sS -o /dev/null -w '%{http_code} gql-get\n' -G --data-urlencode "query=$M" @GH@/graphql || true
curl -sS -o /dev/null -w '%{http_code} gql-batch\n' -H 'Content-Type: application/json' \
  --data-binary "[{\"query\": \"{ viewer { login } }\"}, {\"query\": \"$M\"}]" @GH@/graphql || true
curl -sS -o /dev/null -w '%{http_code} gql-raw\n' -H 'Content-Type: application/graphql' \
  --data-binary "$M" @GH@/graphql || true
git -c http.version=HTTP/2 push -q @GIT@ HEAD:refs/heads/learned-h2 2>&1 | tail -1
exit 0
'''

# one ref update, as git's receive-pack reads it: "<old> <new> <ref>\0<capabilities>\n", flush
_UPDATE = f"{'0' * 40} {'1' * 40} refs/heads/learned\0report-status\n"
PUSH = f"{len(_UPDATE) + 4:04x}{_UPDATE}0000".replace("\0", "\\0")


# Inside a tunnel learn mode opened: a read and a push pipelined in one write, then a CONNECT to
# another name and a push behind it (a tunnel in the tunnel), all on one connection.
PIPELINED = TUNNEL + r'''
body = open("/tmp/push", "rb").read()
hp, other = f"{host}:{port}", sys.argv[2]
push = "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Length: %d\r\n\r\n" % len(body)
t.sendall(f"GET /pipelined-read HTTP/1.1\r\nHost: {hp}\r\n\r\n".encode() +
          push.format("/r.git/git-receive-pack", hp).encode() + body +
          f"CONNECT {other} HTTP/1.1\r\nHost: {other}\r\n\r\n".encode() +
          push.format("/nested/r.git/git-receive-pack", other).encode() + body)
t.settimeout(5)
try:
    while t.recv(65536):
        pass
except OSError:
    pass
'''


def _on_record_whatever_bytes_its_path_holds(attacker, git, stub, n):
    st = hostport(stub, "stub.example.test")
    r = attacker.envgit("learn", "--", "sh", "-c", f": > /tmp/push; python3 raw.py {st} /canary-raw-@FF@", check=True)
    assert reached(stub.requests[n:], "/canary-raw-"), stub.requests[n:]     # let through to the server
    step = json.loads(attacker.envgit("show", "last", "--json", check=True).stdout)
    assert [q for q in step["requests"] if "canary-raw-" in q["path"]], (r.stderr, step["requests"])


def _an_ask_for_a_path_not_utf8_prints_no_traceback(attacker, git, stub, n):
    with put_back(attacker, "envgit.yaml"):
        attacker.write_policy((attacker.root / "envgit.yaml").read_text() + "  - rule: git-push\n    action: ask\n")
        st = hostport(stub, "stub.example.test")
        r = attacker.envgit("learn", "--", "sh", "-c",
                            f"printf '{PUSH}' > /tmp/push; python3 raw.py {st} '/r.git/git-receive-pack?@FF@' push",
                            timeout=60)
    assert not reached(stub.requests[n:], "receive-pack"), stub.requests[n:]
    assert "Traceback" not in r.stderr, r.stderr


def _no_push_upload_or_mutation_by_another_spelling(attacker, git, stub, n):
    """On a host only learn mode lets in (the git server's own taken out of network.allow)."""
    with put_back(attacker, "envgit.yaml"):
        attacker.write_policy((attacker.root / "envgit.yaml").read_text().replace(f'"{hostport(git)}"', ""))
        r = attacker.host("git add -A && git -c user.email=a@b -c user.name=a commit -qm x --allow-empty")
        assert r.returncode == 0, r.stderr
        before = git.refs()
        stub_url, gh = (f"https://{hostport(stub, h)}" for h in ("stub.example.test", "api.github.com"))
        r = attacker.envgit("learn", "--", "sh", "-c", SPELLINGS.replace("@STUB@", stub_url)
                            .replace("@GH@", gh).replace("@GIT@", git.url).replace("@PUSH@", PUSH), timeout=120)
    assert r.returncode == 0, r.stderr
    got = stub.requests[n:]
    assert reached(got, "/control-read"), (r.stdout, r.stderr)        # the host is let in
    leaked = [q for q in got if q["method"] != "GET" or "graphql" in q["path"]]
    leaked += [q for q in got if "receive-pack" in repr(q).lower()]
    assert not leaked, (r.stdout, leaked)
    assert git.refs() == before, r.stdout + r.stderr


def _each_pipelined_request_judged_and_no_tunnel_in_a_tunnel(attacker, git, stub, n):
    st, other = hostport(stub, "stub.example.test"), hostport(stub, "gitlab.com")
    r = attacker.envgit("learn", "--", "sh", "-c", f"printf '{PUSH}' > /tmp/push; python3 pipelined.py {st} {other}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [q["path"] for q in stub.requests[n:]] == ["/pipelined-read"], (r.stderr, stub.requests[n:])


def _a_process_a_learn_step_left_behind_is_not_in_learn_mode(attacker, git, stub, n):
    u = f"https://{hostport(stub, 'stub.example.test')}"
    later = curl(f"{u}/canary-left-behind").strip()
    left = f"(setsid sh -c 'while [ ! -e go ]; do sleep 0.1; done; {later} > left.out 2>&1' &)\n"
    with put_back(attacker, "go", "left.out"):
        r = attacker.envgit("learn", "--", "sh", "-c", left + curl(f"{u}/in-step"), check=True)
        assert reached(stub.requests[n:], "/in-step"), r.stdout + r.stderr     # the step itself was in it
        (attacker.root / "go").touch()
        attacker.own(attacker.root / "go")
        time.sleep(2)
        assert not reached(stub.requests[n:], "canary-left-behind"), stub.requests[n:]


LEARN_STEPS = {
    "a request it let through is on record whatever bytes its path holds": _on_record_whatever_bytes_its_path_holds,
    "an ask for a path that is not UTF-8 prints no traceback": _an_ask_for_a_path_not_utf8_prints_no_traceback,
    "no push, upload or mutation by another spelling": _no_push_upload_or_mutation_by_another_spelling,
    "each pipelined request judged, no tunnel in a tunnel": _each_pipelined_request_judged_and_no_tunnel_in_a_tunnel,
    # last: a process it failed to end would still be waiting to send
    "a process a learn step left behind is not in learn mode": _a_process_a_learn_step_left_behind_is_not_in_learn_mode,
}


def test_learn_mode_records_each_request_and_lets_out_no_push_nor_a_process_left_behind(attacker, gate_servers):
    """LEARN_STEPS, each its own steps in one project and gate, judged on what reached the
    servers during it; a case that changes the policy puts it back."""
    git, stub = gate_servers
    project(attacker, git, stub)
    for name, text in (("raw.py", RAW), ("pipelined.py", PIPELINED)):
        (attacker.root / name).write_text(text)
        attacker.own(attacker.root / name)
    every_case(LEARN_STEPS, lambda case: LEARN_STEPS[case](attacker, git, stub, len(stub.requests)))


# --- learn mode: when it ends, it has ended -------------------------------------------------

WAIT = r'''
touch started
while [ ! -e go ]; do sleep 0.1; done
'''

# Many files written outside envgit since the last step: the next step's begin records them
# first (daemon/steps.py settle, on a thread): 40,000 files take about 2 s on an idle machine.
MANY_FILES = "python3 -c \"import os; os.mkdir('outside'); [open(f'outside/{i}', 'w').write(str(i)) " \
             "for i in range(40000)]\""


def _learn_off_for_a_step_still_running(attacker, stub, u):
    attacker.envgit("learn", "on", check=True)
    script = WAIT + curl(f"{u}/canary-after-learn-off")
    p = subprocess.Popen(attacker._argv([ENVGIT, "run", "--", "sh", "-c", script]), cwd=attacker.root,
                         env=attacker.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not (attacker.root / "started").exists() and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        assert "learn mode is off" in attacker.envgit("learn", "off", check=True).stdout + \
            attacker.envgit("learn", check=True).stdout
        (attacker.root / "go").touch()
        attacker.own(attacker.root / "go")
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return out, err


def _learn_off_for_a_step_whose_begin_it_overtook(attacker, stub, u):
    attacker.envgit("run", "--", "true", check=True)        # the baseline taken: later ones are outside changes
    attacker.envgit("learn", "on", check=True)
    assert attacker.host(MANY_FILES, timeout=60).returncode == 0
    p = subprocess.Popen(attacker._argv([ENVGIT, "run", "--", "sh", "-c", curl(f"{u}/canary-after-learn-off")]),
                         cwd=attacker.root, env=attacker.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)                     # its begin is recording the outside changes
        off = attacker.envgit("learn", "off", check=True).stdout
        if p.poll() is not None or "learn mode is off" not in off:     # the race not set up
            raise AssertionError(f"the step ended before learn off, or learn off failed: {off}")
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return out, err


LEARN_OFF = {"a step still running": (_learn_off_for_a_step_still_running, ("started", "go")),
             "a step whose begin it overtook": (_learn_off_for_a_step_whose_begin_it_overtook, ("outside",))}


@pytest.mark.both_uids("learn mode lives in the daemon of the person's uid")
def test_learn_off_ends_learn_mode_for_a_step_under_way(attacker, gate_servers):
    """LEARN_OFF, each its own steps in one project and gate (each ends with learn mode off,
    and what it wrote in the project removed), judged on what reached the stub during it."""
    git, stub = gate_servers
    project(attacker, git, stub)
    u = f"https://{hostport(stub, 'stub.example.test')}"

    def check(case):
        how, wrote = LEARN_OFF[case]
        n = len(stub.requests)
        with put_back(attacker, *wrote):
            out, err = how(attacker, stub, u)
        assert not reached(stub.requests[n:], "canary-after-learn-off"), (out, err, stub.requests[n:])

    every_case(LEARN_OFF, check)


# --- second look: what the fixes may not cover ------------------------------------------------

# A raw request inside a tunnel: argv[2] the method, argv[3] the request line's target, as
# UTF-8 bytes (curl would percent-encode them); the status is printed.
RAW_REQUEST = TUNNEL + r'''
t.sendall(sys.argv[2].encode() + b" " + sys.argv[3].encode() + b" HTTP/1.1\r\nHost: " +
          f"{host}:{port}".encode() + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
t.settimeout(5)
got = b""
try:
    while True:
        b = t.recv(65536)
        if not b:
            break
        got += b
except OSError:
    pass
print(got.split(b"\r\n", 1)[0].split(b" ")[1].decode() if got else "000")
'''


def test_a_suggested_path_glob_admits_no_other_path_by_unicode_case_folding(attacker, gate_servers):
    # `ſ` (U+017F, long s) holds no glob character and is printable, but url_glob is re.I and
    # Unicode folds ſ to s: a glob /ſecret/** built from the step's path admits /secret/...
    git, stub = gate_servers
    st = hostport(stub, "stub.example.test")
    project(attacker, git, stub, allow=[st], l7=f'    "{st}": {{ methods: [GET], paths: ["/public/**"] }}\n')
    (attacker.root / "rawreq.py").write_text(RAW_REQUEST)
    attacker.own(attacker.root / "rawreq.py")
    r = attacker.run("python3 rawreq.py " + st + " GET /\u017fecret/x\n")
    sug = attacker.envgit("policy", "suggest", "--apply")
    if r.stdout.split() != ["403"] or sug.returncode != 0:      # l7 refused it, and it was applied
        pytest.fail(r.stdout + r.stderr + sug.stdout + sug.stderr)
    attacker.run(curl(f"https://{st}/secret/canary-after-apply"))
    assert not reached(stub, "canary-after-apply"), (sug.stdout, stub.requests)


def test_a_method_suggest_names_is_one_the_step_sent_not_its_unicode_upper_case(attacker, gate_servers):
    # `poſt`: str.upper() makes it POST, which the step never sent (the stub answers a method it
    # has no handler for itself, 501, before its request log)
    git, stub = gate_servers
    project(attacker, git, stub)
    (attacker.root / "rawreq.py").write_text(RAW_REQUEST)
    attacker.own(attacker.root / "rawreq.py")
    st = hostport(stub, "stub.example.test")
    r = attacker.envgit("learn", "--", "sh", "-c", f"python3 rawreq.py {st} po\u017ft /canary-post")
    sug = attacker.envgit("policy", "suggest", "--apply")
    if r.returncode != 0 or reached(stub, "canary-post") or sug.returncode != 0:
        pytest.fail(r.stdout + r.stderr + sug.stdout + sug.stderr + repr(stub.requests))
    attacker.run(curl("-X POST", f"https://{st}/canary-post"))
    assert not reached(stub, "canary-post"), (r.stdout, sug.stdout, stub.requests)


@pytest.mark.both_uids("the record is the gate's, which runs as the person; shown as both")
def test_hosts_a_step_spells_oddly_are_suggested_as_their_name_or_not_at_all(attacker, gate_servers):
    # refused CONNECTs: a name in upper case with a trailing dot, an IPv4 address in a legacy
    # form and an IPv6 literal in brackets that both lead to loopback, where the stub listens
    git, stub = gate_servers
    project(attacker, git, stub)
    odd = [f"https://STUB.Example.TEST.:{stub.port}/x", f"https://127.1:{stub.port}/x",
           f"'https://[::ffff:127.0.0.1]:{stub.port}/x'", f"https://0x7f000001:{stub.port}/x"]
    r = attacker.run("".join(curl("-g", u) for u in odd))
    sug = attacker.envgit("policy", "suggest", "--apply")
    if r.stdout.split() != ["000"] * 4 or sug.returncode != 0:      # all refused, nothing stopped suggest
        pytest.fail(r.stdout + r.stderr + sug.stdout + sug.stderr)
    added = [ln for ln in sug.stdout.splitlines() if ln.startswith("+ ") or ln.startswith("+  ")]
    assert f'"stub.example.test:{stub.port}"' in sug.stdout and "Traceback" not in sug.stderr, sug.stdout
    for u in (f"https://127.0.0.1:{stub.port}/canary-loopback", f"https://localhost:{stub.port}/canary-loopback"):
        attacker.run(curl(u))
    assert not reached(stub, "canary-loopback"), (added, sug.stdout, stub.requests)


def test_paths_whose_first_segment_yaml_reads_specially_or_is_encoded_suggest_no_wider_line(attacker, gate_servers):
    git, stub = gate_servers
    project(attacker, git, stub)
    u = f"https://{hostport(stub, 'stub.example.test')}"
    sent = ["/&a/x", "/!x", "/%2A/x", "/%2a%2a", "/a,b", "/-", "/:x", "/'q", "/%7Bb%7D"]
    r = attacker.envgit("learn", "--", "sh", "-c", "".join(curl("-g --path-as-is", f"'{u}{p}'") for p in sent))
    sug = attacker.envgit("policy", "suggest", "--apply")
    if "403" in r.stdout.split() or sug.returncode != 0:          # learn mode let all through; applied
        pytest.fail(r.stdout + r.stderr + sug.stdout + sug.stderr)
    back = attacker.run(curl(f"{u}/a,b") + curl("-X DELETE", f"{u}/private/canary-after-apply") +
                        curl(f"{u}/canary-after-apply/x") + curl("--path-as-is", f"{u}/*/canary-after-apply"))
    assert back.stdout.split()[0] == "200", back.stdout + back.stderr        # the file still loads
    assert not reached(stub, "canary-after-apply"), (sug.stdout, stub.requests)


# Inside a tunnel learn mode opened to argv[1]: one request whose Host header names argv[2],
# one in absolute form naming argv[2]; each status printed.
OTHER_AUTHORITY = TUNNEL + r'''
other = sys.argv[2]
for line in (f"GET /canary-host-header HTTP/1.1\r\nHost: {other}",
             f"GET https://{other}/canary-absolute-form HTTP/1.1\r\nHost: {other}"):
    t.sendall(f"{line}\r\nContent-Length: 0\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = t.recv(1)
        if not b:
            break
        head += b
    n = [int(h.split(b":")[1]) for h in head.lower().split(b"\r\n") if h.startswith(b"content-length:")]
    body = b""
    while n and len(body) < n[0]:
        body += t.recv(n[0] - len(body))
    print(head.split(b" ")[1].decode() if head else "000")
'''


def test_another_authority_inside_a_learn_tunnel_is_not_let_through_nor_suggested(attacker, gate_servers):
    git, stub = gate_servers
    project(attacker, git, stub)
    (attacker.root / "other.py").write_text(OTHER_AUTHORITY)
    attacker.own(attacker.root / "other.py")
    st, other = hostport(stub, "stub.example.test"), hostport(stub, "gitlab.com")
    r = attacker.envgit("learn", "--", "sh", "-c", f"python3 other.py {st} {other}")
    sug = attacker.envgit("policy", "suggest", "--apply")
    attacker.run(curl(f"https://{other}/canary-after-apply"))
    assert r.stdout.split() == ["403", "403"], r.stdout + r.stderr
    assert not reached(stub, "canary"), (r.stdout, sug.stdout, stub.requests)


# argv[2] a whole request head, "@FF@" standing for the byte 0xff and "@ESC@" for 0x1b.
RAW_HEAD = TUNNEL + r'''
head = sys.argv[2].encode().replace(b"@FF@", b"\xff").replace(b"@ESC@", b"\x1b").replace(b"|", b"\r\n")
t.sendall(head + b"\r\nHost: " + f"{host}:{port}".encode() + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
t.settimeout(5)
try:
    while t.recv(65536):
        pass
except OSError:
    pass
'''


def test_bytes_that_are_not_text_in_a_method_or_a_header_a_rule_reads_are_on_record(attacker, gate_servers):
    git, stub = gate_servers
    project(attacker, git, stub)
    (attacker.root / "head.py").write_text(RAW_HEAD)
    attacker.own(attacker.root / "head.py")
    st = hostport(stub, "stub.example.test")
    heads = ["G@FF@T /canary-method HTTP/1.1", "GET /canary-override HTTP/1.1|X-HTTP-Method-Override: DEL@FF@@ESC@ETE",
             "POST /canary-ctype HTTP/1.1|Content-Type: application/vnd.git-lfs@FF@+json"]
    r = attacker.envgit("learn", "--", "sh", "-c", "".join(f"python3 head.py {st} '{h}'\n" for h in heads))
    step = json.loads(attacker.envgit("show", "last", "--json", check=True).stdout)
    paths = [q["path"] for q in step["requests"]]
    sug = attacker.envgit("policy", "suggest")
    assert all(any(f"/canary-{w}" in p for p in paths) for w in ("method", "override", "ctype")), \
        (r.stderr, paths)
    assert "Traceback" not in sug.stderr + r.stderr and "\x1b" not in sug.stdout, sug.stdout + sug.stderr
