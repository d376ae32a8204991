"""Red team 13b: the credential's host echoes the real token it was sent (a debug endpoint,
as in test_credential_bodies.py), in a body the gate reads differently from the step's client.

The gate rewrites real values in a response only where it decodes the body the way it was
encoded. Each answer here is ordinary HTTP a client reads whole, but the gate does not:

- gzip in several members (RFC 1952 allows it; Python's gzip/urllib3, Go's gzip.Reader,
  Node's zlib and gzip(1) read every member): the gate decodes the first member only, both
  for a buffered body (Content-Length) and for a streamed one (chunked);
- gzip whose CRC-32 trailer is wrong, in a buffered body: the gate's decoder fails, so it
  looks for the value in the compressed bytes only and passes the body on; gzip(1) (and any
  client that inflates before it checks the trailer) writes the token;
- zstd in several frames (libzstd, curl --compressed and zstd(1) read every frame): the gate
  reads the first frame only;
- gzip as a transfer coding (`Transfer-Encoding: gzip, chunked`, "gzip inside chunked"):
  the gate looks at the compressed bytes as if identity, and curl (7.88, plain `curl -o`)
  undoes the transfer coding and writes the token;
- a streamed (chunked, unframed) JSON body whose value is `\\u`-escaped: the buffered path
  undoes the escapes, the streamed path does not.

The step runs real curl (and python3/gzip/zstd to read the saved bytes) through the real gate;
the oracle is the canary (the real token, in the person's environment only) in the step's
output. Runs as root: the gate's judgement does not depend on the step's uid."""

import base64
import gzip
import shutil
import time
from contextlib import contextmanager

import pytest

from conftest import CANARY
from gatekit import netproject, servers
from kit.rawtls import raw_tls_server, read_head

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

NAME = "api.github.com"        # one of gatekit.STUB_NAMES: resolved to 127.0.0.1 by netproject


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def _answer(path: str, token: str) -> bytes:
    """What the echoing server writes for `path`: the token it received, encoded so."""
    t = token.encode()
    echo = b'{"you_sent": "' + t + b'"}\n'
    if path == "/gzip-members":                # Content-Length, buffered at the gate
        body = gzip.compress(b"{}\n") + gzip.compress(echo)
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    if path == "/gzip-members-chunked":        # no length: streamed at the gate
        body = gzip.compress(b"{}\n") + gzip.compress(echo)
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + _chunked(body))
    if path == "/gzip-bad-crc":                # one member, its CRC-32 off by one bit
        body = bytearray(gzip.compress(echo))
        body[-8] ^= 1
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), bytes(body)))
    if path == "/zstd-frames":
        import zstandard
        z = zstandard.ZstdCompressor()
        body = z.compress(b"{}\n") + z.compress(echo)
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: zstd\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    if path == "/te-gzip":
        body = gzip.compress(echo)
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n" + _chunked(body))
    if path == "/u-stream":
        body = b'{"you_sent": "' + "".join(f"\\u{ord(c):04x}" for c in token).encode() + b'"}\n'
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + _chunked(body))
    if path == "/reason":                      # the echo in the status line's reason phrase
        return (b"HTTP/1.1 401 Bad credentials " + t + b"\r\nContent-Type: text/plain\r\n"
                b"Content-Length: 3\r\nConnection: close\r\n\r\nno\n")
    if path == "/bad-head":                    # the echo in a header line without its colon
        return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Debug auth=" + t +
                b"\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
    if path.startswith("/range"):              # a debug endpoint behind a server that serves byte ranges
        return _ranged(echo, path.partition("?")[2])
    spelled = SPELLINGS.get(path)
    if spelled is not None:
        body = spelled(token)
        return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def _ranged(body: bytes, spec: str) -> bytes:
    """`spec` is the Range header's value (the step's `curl -r`), passed in the path's query
    by echo_server: a 206 with those bytes, as Go's http.ServeContent, nginx's slice module
    or any static-file layer in front of the endpoint would send."""
    if not spec.startswith("bytes="):
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nAccept-Ranges: bytes\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    a, _, b = spec[6:].partition("-")
    a, b = int(a), (int(b) if b else len(body) - 1)
    part = body[a:b + 1]
    return (b"HTTP/1.1 206 Partial Content\r\nContent-Type: application/json\r\n"
            b"Content-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (a, a + len(part) - 1, len(body), len(part), part))


# Other spellings of the echoed token in a buffered body (a hexdump, base32, UTF-16 text,
# HTML numeric character references): none is looked for.
SPELLINGS = {
    "/hex": lambda t: b"token(hex)=" + t.encode().hex().encode() + b"\n",
    "/base32": lambda t: b"token(b32)=" + base64.b32encode(t.encode()) + b"\n",
    "/utf16": lambda t: ("token=" + t + "\n").encode("utf-16"),
    "/entities": lambda t: b"<p>" + "".join(f"&#{ord(c)};" for c in t).encode() + b"</p>\n",
}


@contextmanager
def echo_server(ca, answer=_answer):
    """An HTTPS/1.1 server on 127.0.0.1 writing raw responses; it answers with the Bearer token
    it was sent. `seen` holds each request's Authorization header (its log)."""
    seen = []

    def handle(s):
        try:
            path, hdrs = read_head(s)
        except OSError:
            return
        rng = hdrs.get("range", "")
        if rng:
            path += "?" + rng
        auth = hdrs.get("authorization", "")
        seen.append(auth)
        s.sendall(answer(path, auth.partition(" ")[2]))
        time.sleep(0.2)

    with raw_tls_server(ca, [NAME, "localhost"], "echo13b", handle) as port:
        yield port, seen


@contextmanager
def world(attacker, answer=_answer):
    with servers() as (git, stub), echo_server(git.ca, answer) as (port, seen):
        attacker.env["MY_TOKEN"] = CANARY
        api = f"{NAME}:{port}"
        netproject(attacker, git, stub, allow=[api], tail=(
            f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"))
        yield f"https://{api}", seen


# How the step reads the saved body (/tmp/b): every decoder here is an ordinary one.
READ = {
    "/gzip-members": "gzip -dc < /tmp/b || python3 -c \"import gzip,sys; "
                     "sys.stdout.write(gzip.decompress(open('/tmp/b','rb').read()).decode())\"",
    "/gzip-members-chunked": "gzip -dc < /tmp/b || python3 -c \"import gzip,sys; "
                             "sys.stdout.write(gzip.decompress(open('/tmp/b','rb').read()).decode())\"",
    "/gzip-bad-crc": "gzip -dc < /tmp/b",     # gzip(1) writes what it inflated, then says "crc error"
    "/zstd-frames": "zstd -dc < /tmp/b",
    "/te-gzip": "cat /tmp/b",                # curl itself undoes the gzip transfer coding
    "/u-stream": "python3 -c \"import json; print(json.load(open('/tmp/b'))['you_sent'])\"",
}


@pytest.mark.parametrize("path", list(READ))
def test_an_echoed_real_token_in_an_odd_body_does_not_reach_the_step(attacker, path):
    with world(attacker) as (url, seen):
        r = attacker.run(f"curl -sS -H \"Authorization: Bearer $MY_TOKEN\" {url}{path} -o /tmp/b; "
                         f"echo \"curl-exit=$?\"; {READ[path]}")
        out = r.stdout + r.stderr
        assert seen and seen[-1] == f"Bearer {CANARY}", seen        # the real token arrived
        assert CANARY not in out, f"the real token reached the step through {path}:\n{out}"


def test_an_echoed_real_token_fetched_in_byte_ranges_does_not_reach_the_step(attacker):
    """The gate looks for the whole value in each response; two ranges of the same answer,
    split inside the token, each hold half of it. The step joins them."""
    with world(attacker) as (url, seen):
        auth = "-H \"Authorization: Bearer $MY_TOKEN\""
        r = attacker.run(f"curl -sS {auth} -r 0-24 {url}/range -o /tmp/a; "
                         f"curl -sS {auth} -r 25- {url}/range -o /tmp/b; cat /tmp/a /tmp/b")
        out = r.stdout + r.stderr
        assert seen and seen[-1] == f"Bearer {CANARY}", seen
        assert CANARY not in out, f"the real token reached the step in two ranges:\n{out}"


@pytest.mark.parametrize("path", list(SPELLINGS))
def test_an_echoed_real_token_in_another_spelling_does_not_reach_the_step(attacker, path):
    decode = {
        "/hex": "sed 's/.*=//' /tmp/b | xxd -r -p || python3 -c \"import sys; "
                "print(bytes.fromhex(open('/tmp/b').read().split('=')[1]).decode())\"",
        "/base32": "sed 's/.*=//' /tmp/b | base32 -d",
        "/utf16": "iconv -f UTF-16 -t UTF-8 /tmp/b || "
                  "python3 -c \"print(open('/tmp/b','rb').read().decode('utf-16'))\"",
        "/entities": "python3 -c \"import html; print(html.unescape(open('/tmp/b').read()))\"",
    }[path]
    with world(attacker) as (url, seen):
        r = attacker.run(f"curl -sS -H \"Authorization: Bearer $MY_TOKEN\" {url}{path} -o /tmp/b; {decode}")
        out = r.stdout + r.stderr
        assert seen and seen[-1] == f"Bearer {CANARY}", seen
        assert CANARY not in out, f"the real token reached the step as {path[1:]}:\n{out}"


def test_an_echoed_real_token_in_a_malformed_response_head_reaches_neither_step_nor_journal(attacker):
    """A response head mitmproxy cannot parse never reaches the credential addon: mitmproxy
    answers the step itself with a 502 whose text quotes the bad line (`Invalid header line:
    b'...'`), and the gate records that text as the request's `error`, unscrubbed."""
    with world(attacker) as (url, seen):
        r = attacker.run(f"curl -sS -H \"Authorization: Bearer $MY_TOKEN\" {url}/bad-head")
        out = r.stdout + r.stderr
        assert seen and seen[-1] == f"Bearer {CANARY}", seen
        log = attacker.envgit("log", "--json").stdout
        assert CANARY not in log, "the real token is in the journal (the request's error)"
        assert CANARY not in out, f"the real token reached the step in the gate's 502:\n{out}"


def test_an_echoed_real_token_in_the_reason_phrase_does_not_reach_the_step(attacker):
    """Headers, trailers and bodies are rewritten; the status line's reason phrase (an
    error's text: `401 Bad credentials <token>`) is passed on as the server wrote it."""
    with world(attacker) as (url, seen):
        r = attacker.run(f"curl -sS -D - -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" {url}/reason")
        out = r.stdout + r.stderr
        assert seen and seen[-1] == f"Bearer {CANARY}", seen
        assert CANARY not in out, f"the real token reached the step in the reason phrase:\n{out}"


def test_a_stored_real_token_fetched_in_byte_ranges_does_not_reach_the_step(attacker):
    """The ranges asked on a request that carries no token: the server kept what it was sent
    (a request inspector, an audit or debug log on the credential's host) and serves that log
    with byte ranges. A gate that drops Range only where it swaps a token in still hands the
    step two halves."""
    log = []

    def answer(path, token):
        if path == "/store":
            log.append(b'{"you_sent": "' + token.encode() + b'"}\n')
            return b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
        if path.startswith("/log"):
            return _ranged(b"".join(log), path.partition("?")[2])
        return _answer(path, token)
    with world(attacker, answer) as (url, seen):
        r = attacker.run(f"curl -sS -H \"Authorization: Bearer $MY_TOKEN\" {url}/store; "
                         f"curl -sS -r 0-24 {url}/log -o /tmp/a; curl -sS -r 25- {url}/log -o /tmp/b; "
                         "cat /tmp/a /tmp/b")
        out = r.stdout + r.stderr
        assert f"Bearer {CANARY}" in seen, seen
        assert CANARY not in out, f"the real token reached the step in two ranges of a stored log:\n{out}"
