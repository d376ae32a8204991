"""Red team: the credential's host answers the real token it was sent in a spelling no whole-value
form lists. The gate looked for the real value in a list of spellings (echo.forms: plain, all
characters percent-encoded, `&#103;` and `&#x67;` for every character, hex, ...), never in the
text as the step's client reads it, so each of these passed into the step recorded `allow`:

- percent-encoded byte by byte, or only the first or last byte (`%43ANARY…`), in a body (as it
  is, chunked, a few bytes a chunk) and in a redirect's Location;
- HTML character references spelled otherwise: zero-padded (`&#00067;`), `&#X43;`, one
  reference among plain text, a named one (`&lowbar;`);
- a header folded across lines (obs-fold: mitmproxy passes it, clients unfold it);
- UTF-32, quoted-printable, mixed-case or colon-separated hex, `\\xNN` and octal escapes, CSS
  escapes, base85 and ascii85.

On a credential's host the gate now looks in readings of the text (credentials/readings.py):
what holds the value in a spelling it cannot rewrite is withheld (a 502) or cut off (a closed
stream), a header dropped, and recorded. The step decodes what it got every way it can; the
oracle is the canary (the real token, in the person's environment only) in what it read."""

import base64
import json
import shutil
import time
from contextlib import contextmanager

import pytest

from conftest import CANARY
from gatekit import netproject, servers
from harness import every_case
from kit.rawtls import raw_tls_server, read_head

pytestmark = pytest.mark.skipif(shutil.which("socat") is None or shutil.which("python3") is None,
                                reason="socat or python3 is not installed")

NAME = "api.github.com"        # gatekit.STUB_NAMES: resolved to 127.0.0.1 by netproject
TOKEN = CANARY + "_Ab"         # a `_` for the named reference (&lowbar;)


def _pct(s: bytes) -> bytes:
    return b"".join(b"%%%02X" % c for c in s)


SPELL = {
    "pct-all": _pct,
    "pct-first": lambda t: _pct(t[:1]) + t[1:],
    "pct-last": lambda t: t[:-1] + _pct(t[-1:]),
    "html-padded": lambda t: b"".join(b"&#%05d;" % c for c in t),
    "html-X": lambda t: b"".join(b"&#X%X;" % c for c in t),
    "html-one": lambda t: b"&#%d;" % t[0] + t[1:],
    "html-named": lambda t: t.replace(b"_", b"&lowbar;"),
    "html-overlong": lambda t: b"".join(b"&#%020d;" % c for c in t),   # past the stream's hold
    "utf-32": lambda t: t.decode().encode("utf-32-le"),
    "qp": lambda t: b"".join(b"=%02X" % c for c in t),
    "hex-mixed": lambda t: t.hex().upper().encode()[:9] + t.hex().encode()[9:],
    "hex-colons": lambda t: b":".join(b"%02x" % c for c in t),
    "x-escapes": lambda t: b"".join(b"\\x%02x" % c for c in t),
    "octal": lambda t: b"".join(b"\\%03o" % c for c in t),
    "css": lambda t: b"".join(b"\\%x " % c for c in t),
    "base85": lambda t: base64.b85encode(b"ab" + t),
    "ascii85": lambda t: base64.a85encode(b"a" + t),
}
TRICKLED = [s for s in SPELL if s.startswith(("pct", "html"))]
REWRITTEN = {"utf-32"}          # a listed form: put back as the placeholder, not cut

# The step's reader: every decoding its client or a line of code could apply, printed.
READER = r'''
import base64, binascii, codecs, html, quopri, re, sys
from urllib.parse import unquote
d = b"".join(open(p, "rb").read() for p in sys.argv[1:])
t = d.decode("latin-1")
out = [t, unquote(t), html.unescape(t), html.unescape(unquote(t)), unquote(html.unescape(t)),
       re.sub(r"\r?\n[ \t]+", "", t), quopri.decodestring(d).decode("latin-1"),
       *(d[i:].decode(c, "replace") for i in range(4) for c in ("utf-32-le", "utf-32-be")),
       re.sub(r"\\([0-9a-fA-F]{1,6}) ?", lambda m: chr(int(m[1], 16)), t)]
try:
    out.append(codecs.decode(t, "unicode_escape"))
except Exception:
    pass
digits = re.sub(r"[^0-9a-f]", "", re.sub(r"0x|\\x", "", t.lower()))
for i in (0, 1):
    out.append(bytes.fromhex(digits[i:len(digits) - (len(digits) - i) % 2]).decode("latin-1"))
for run in re.findall(r"\S{20,}", t):
    for dec in (base64.b85decode, base64.a85decode):
        try:
            out.append(dec(run).decode("latin-1"))
        except Exception:
            pass
print("\n".join(out))
'''


def _buffered(body: bytes) -> list[bytes]:
    return [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (len(body), body)]


def _chunked(pieces: list[bytes]) -> list[bytes]:
    return [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n"] + [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p] + \
        [b"0\r\n\r\n"]


def _answer(path: str, token: bytes) -> list[bytes]:
    """What the echoing server writes for /<how>/<spelling>, as pieces written apart."""
    _, how, spelling = path.split("/", 2)
    if how == "fold":               # the token folded across two header lines (obs-fold)
        return [b"HTTP/1.1 200 OK\r\nX-Tok: " + token[:9] + b"\r\n " + token[9:] +
                b"\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"]
    spelled = SPELL[spelling](token)
    if how == "location":
        return [b"HTTP/1.1 301 Moved\r\nLocation: https://" + NAME.encode() + b"/next?t=" + spelled +
                b"\r\nContent-Length: 6\r\nConnection: close\r\n\r\nmoved\n"]
    body = b"you sent: " + spelled + b"\n"
    if how == "buffered":
        return _buffered(body)
    if how == "stream":
        return _chunked([b"you sent: ", spelled + b"\n"])
    return _chunked([body[i:i + 3] for i in range(0, len(body), 3)])     # trickle


@contextmanager
def world(attacker):
    """The echoing server as the credential's host; `seen` holds each request's Authorization."""
    seen = []

    def handle(s):
        path, hdrs = read_head(s)
        seen.append(hdrs.get("authorization", ""))
        for i, piece in enumerate(_answer(path, hdrs.get("authorization", "").partition(" ")[2].encode())):
            if i:
                time.sleep(0.02)
            s.sendall(piece)
        time.sleep(0.2)

    with servers() as (git, stub), raw_tls_server(git.ca, [NAME], "spellings", handle) as port:
        attacker.env["MY_TOKEN"] = TOKEN
        api = f"{NAME}:{port}"
        netproject(attacker, git, stub, allow=[api], tail=(
            f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"))
        attacker.run(f"cat > read.py <<'EOF'\n{READER}\nEOF")     # the step's /tmp is its own
        yield api, seen


def _fetch(attacker, api, seen, path) -> str:
    """One step fetches `path`; `seen` is emptied first, so what it holds after is this step's."""
    seen.clear()
    r = attacker.run(f"rm -f b h; curl -sS -D h -H \"Authorization: Bearer $MY_TOKEN\" https://{api}{path} "
                     "-o b; echo curl-exit=$?; touch b h; cat h; python3 read.py h b")
    return r.stdout + r.stderr


def _last(attacker) -> dict:
    return json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]


def _check_body(attacker, api, seen, how, spelling):
    out = _fetch(attacker, api, seen, f"/{how}/{spelling}")
    assert seen and seen[-1] == f"Bearer {TOKEN}", seen            # the real token arrived
    assert CANARY not in out, f"the real token reached the step ({spelling}, {how}):\n{out}"
    s = _last(attacker)
    if spelling in REWRITTEN:
        assert [q for q in s["requests"] if q.get("credential_echo") == "tok"], s["requests"]
    elif how == "buffered":
        assert "HTTP/1.1 502" in out and "envgit" in out, out
        assert "credential-misuse" in s["marks"], (s["marks"], s["requests"])
    else:
        assert "curl-exit=0" not in out, out
        assert "credential-misuse" in s["marks"], (s["marks"], s["requests"])


# Each test below is one world (servers, project, gate: a new one per case cost the suite
# minutes); every case is its own step in it, and every case that fails is named (every_case).
# No case changes the policy or the server: what one leaves (b, h) the next step removes.

def test_a_spelled_real_token_in_a_body_never_reaches_the_step(attacker):
    """Every spelling, in a body as it is and streamed, each its own step."""
    with world(attacker) as (api, seen):
        every_case([f"{how}/{spelling}" for how in ("buffered", "stream") for spelling in SPELL],
                   lambda case: _check_body(attacker, api, seen, *case.split("/")))


@pytest.mark.both_uids("the stream is cut in the daemon, which runs as the step's user")
def test_a_spelled_real_token_trickled_a_few_bytes_a_chunk_is_cut_before_it_passes(attacker):
    """Three bytes an HTTP chunk: the gate holds back what may begin the value in the
    percent/HTML reading, so no prefix of it reaches the step either."""
    def check(spelling):
        _check_body(attacker, api, seen, "trickle", spelling)
        got = attacker.run("python3 read.py b").stdout
        assert CANARY[:4] not in got, f"a prefix of the token reached the step:\n{got}"

    with world(attacker) as (api, seen):
        every_case(TRICKLED, check)


def _check_location(attacker, api, seen, spelling):
    out = _fetch(attacker, api, seen, f"/location/{spelling}")
    assert seen and seen[-1] == f"Bearer {TOKEN}", seen
    assert CANARY not in out, f"the real token reached the step in a Location ({spelling}):\n{out}"
    assert "301" in out, out
    assert [q for q in _last(attacker)["requests"] if q.get("credential_echo") == "tok"]


def _check_folded(attacker, api, seen):
    """`X-Tok: CANARY-7\\r\\n f3a9c…`: mitmproxy passes the folded line on; clients unfold it."""
    out = _fetch(attacker, api, seen, "/fold/-")
    assert seen and seen[-1] == f"Bearer {TOKEN}", seen
    assert CANARY not in out, f"the real token reached the step in a folded header:\n{out}"
    assert "curl-exit=0" in out and "HTTP/1.1 200" in out, out
    assert [q for q in _last(attacker)["requests"] if q.get("credential_echo") == "tok"], out


@pytest.mark.both_uids("headers are rewritten in the daemon, which runs as the step's user")
def test_a_spelled_real_token_in_a_location_or_a_folded_header_is_dropped(attacker):
    """A Location spelled four ways, and a header folded across lines: each its own step."""
    def check(case):
        how, _, spelling = case.partition("/")
        if how == "fold":
            _check_folded(attacker, api, seen)
        else:
            _check_location(attacker, api, seen, spelling)

    with world(attacker) as (api, seen):
        every_case([f"location/{s}" for s in ("pct-all", "pct-first", "pct-last", "html-one")] + ["fold"], check)
