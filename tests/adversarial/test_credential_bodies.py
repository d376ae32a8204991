"""Issue 13: a response body never hands the step a real credential value.

The credential's host (or any other host the gate intercepts) answers with the real token in
its body: a debug endpoint echoing the Authorization it received, as JSON, chunked with the
token split across two chunks sent apart, gzip'd (with a length, and chunked), in a body far
past the gate's 1 MiB buffer,
in an SSE stream, base64'd as Basic credentials. The step runs real curl through the real
gate; the oracle is the canary (the real token, in the person's environment only): it must
not be in anything the step read. Where the gate rewrites, the step reads the placeholder;
where it cannot (a large body framed by Content-Length whose placeholder is longer), the body
is cut off and the step marked. Runs as root: the gate's judgement does not depend on the step's uid."""

import base64
import gzip
import json
import shutil
import time
from contextlib import contextmanager

import pytest

from conftest import CANARY
from gatekit import netproject, servers
from kit.rawtls import raw_tls_server, read_head

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

NAME = "api.github.com"        # one of gatekit.STUB_NAMES: resolved to 127.0.0.1 by netproject


def _answer(path: str, token: str, ranged: str = "") -> list[bytes]:
    """What the echoing server writes for `path`, as pieces sent apart (a short pause
    between them, so each is its own read at the gate). `ranged`: the request's Range."""
    t = token.encode()
    if path == "/range":                 # honours `Range: bytes=A-B` as servers do
        body = json.dumps({"you_sent": token}).encode()
        if ranged.startswith("bytes="):
            a, _, b = ranged[6:].partition("-")
            part = body[int(a):int(b) + 1]
            return [b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                    % (int(a), int(a) + len(part) - 1, len(body), len(part), part)]
        return [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)]
    if path == "/json":
        body = json.dumps({"you_sent": token, "path": path}).encode()
        return [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)]
    if path == "/basic":
        body = b"Basic " + base64.b64encode(b"x-access-token:" + t)
        return [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)]
    if path == "/gzip":
        body = gzip.compress(b'{"token": "' + t + b'"}' + b" " * 5000)
        return [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)]
    if path == "/gzip-chunked":         # compressed, no declared length (as many APIs answer)
        body = gzip.compress(b'{"token": "' + t + b'"}' + b" " * 5000)
        half = len(body) // 2
        return [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n" % (half, body[:half]),
                b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - half, body[half:])]
    if path == "/chunked":
        half = len(t) // 2
        a, b = b"token=" + t[:half], t[half:] + b"\n"
        return [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n%x\r\n%s\r\n" % (len(a), a),
                b"%x\r\n%s\r\n0\r\n\r\n" % (len(b), b)]
    if path == "/sse":
        out = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: close\r\n\r\n"]
        for event in (b"data: first\n\n", b"data: " + t[:5], t[5:] + b"\n\n", b"data: last\n\n"):
            out.append(b"%x\r\n%s\r\n" % (len(event), event))
        out.append(b"0\r\n\r\n")
        return out
    if path == "/large":
        filler = b"a" * (3 << 20)
        body = filler + t + b"\n" + filler
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n" \
               b"Connection: close\r\n\r\n" % len(body)
        return [head + body[:len(filler) + 10], body[len(filler) + 10:]]
    if path == "/plainlarge":            # the same size, no token: passes whole
        body = b"b" * (5 << 20)
        return [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)]
    return [b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"]


@contextmanager
def echo_server(ca):
    """An HTTPS/1.1 server on 127.0.0.1 writing raw responses (chunking and pauses are its
    own); it answers with the Bearer token it was sent. `seen` holds each request's
    Authorization header, `ranges` its Range header (its log)."""
    seen, ranges = [], []

    def handle(s):
        try:
            path, hdrs = read_head(s)
        except OSError:
            return
        auth = hdrs.get("authorization", "")
        seen.append(auth)
        ranges.append(hdrs.get("range", ""))
        for i, piece in enumerate(_answer(path, auth.partition(" ")[2], hdrs.get("range", ""))):
            if i:
                time.sleep(0.3)
            s.sendall(piece)

    with raw_tls_server(ca, [NAME, "localhost"], "echo", handle) as port:
        yield port, seen, ranges


@contextmanager
def world(attacker):
    with servers() as (git, stub), echo_server(git.ca) as (port, seen, ranges):
        attacker.env["MY_TOKEN"] = CANARY
        api = f"{NAME}:{port}"
        netproject(attacker, git, stub, allow=[api], tail=(
            f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"))
        yield f"https://{api}", seen, ranges


def _fetch(attacker, url, path, extra=""):
    """curl in the step, the placeholder as its Bearer token; everything it read, and its
    exit status, on stdout."""
    return attacker.run(f"curl -sS {extra} -H \"Authorization: Bearer $MY_TOKEN\" {url}{path}; "
                        "echo \" curl-exit=$?\"")


@pytest.mark.parametrize("path", ["/json", "/chunked", "/gzip", "/gzip-chunked", "/sse", "/basic"])
def test_a_real_value_in_the_body_comes_back_as_the_placeholder(attacker, path):
    with world(attacker) as (url, seen, ranges):
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        assert ph and ph != CANARY
        r = _fetch(attacker, url, path, extra="--compressed" if "gzip" in path else "")
        out = r.stdout + r.stderr
        assert seen and seen[-1] == f"Bearer {CANARY}", seen        # the real token arrived
        assert CANARY not in out, out
        assert "curl-exit=0" in out, out
        shown = base64.b64decode(out.split()[1]).decode() if path == "/basic" else out
        assert ph in shown, out                                      # read as the placeholder
        if path == "/sse":
            assert out.index("data: first") < out.index(ph) < out.index("data: last"), out
        s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
        assert [q for q in s["requests"] if q.get("credential_echo") == "tok"], s["requests"]
        assert CANARY not in json.dumps(s)


def test_a_large_body_with_the_real_value_is_cut_off_and_marked(attacker):
    """Past the 1 MiB the gate buffers, framed by Content-Length, the placeholder (42
    characters) cannot replace the 25-character token without breaking the framing: the body
    stops before the token, the step's request is marked."""
    with world(attacker) as (url, seen, ranges):
        r = attacker.run(f"curl -sS -H \"Authorization: Bearer $MY_TOKEN\" {url}/large -o /tmp/got; "
                         "echo \"curl-exit=$?\"; grep -c CANARY /tmp/got; "
                         "echo \"size=$(wc -c < /tmp/got)\"")
        out = r.stdout + r.stderr
        assert seen and seen[-1] == f"Bearer {CANARY}", seen
        assert CANARY not in out
        assert "curl-exit=0" not in out, out                        # the client saw it cut off
        lines = r.stdout.split()
        assert lines[1] == "0", out                                 # no part of it arrived
        assert 0 < int(lines[2].partition("=")[2]) <= (3 << 20) + 10, out
        s = json.loads(attacker.envgit("log", "--json", check=True).stdout)[-1]
        assert "credential-misuse" in s["marks"], s["marks"]
        cut = [q for q in s["requests"] if q.get("kind") == "credential-echo"]
        assert cut and cut[0]["credential"] == "tok", s["requests"]


def test_a_large_body_without_it_passes_whole(attacker):
    with world(attacker) as (url, seen, ranges):
        r = attacker.run(f"curl -sS {url}/plainlarge | wc -c")
        assert r.stdout.strip() == str(5 << 20), r.stdout + r.stderr


def test_byte_ranges_of_an_echo_never_hand_out_fragments(attacker):
    """A step asking for byte ranges of an answer that echoes the token would get pieces of
    it, each too short to recognise. A request the gate swaps a token into goes without its
    Range: the whole answer comes back, rewritten."""
    with world(attacker) as (url, seen, ranges):
        ph = attacker.run("printf %s \"$MY_TOKEN\"").stdout
        r = attacker.run("; ".join(f"curl -sS -r {a}-{b} -H \"Authorization: Bearer $MY_TOKEN\" {url}/range"
                                   for a, b in ((0, 24), (25, 40))))
        out = r.stdout + r.stderr
        assert seen and all(a == f"Bearer {CANARY}" for a in seen), seen
        assert ranges and not any(ranges), ranges          # the server never had a Range
        assert CANARY[:10] not in out and CANARY[10:] not in out, out
        assert out.count(ph) == 2, out
