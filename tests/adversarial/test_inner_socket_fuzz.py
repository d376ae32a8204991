"""Class 12 and class 14's forged records: the inner control socket is reachable from inside
an agent's sandbox, so every byte on it is hostile. It speaks length-prefixed JSON, checks
every field and caps the frame; random and crafted frames (huge length prefixes, marshal
list-count bombs that segfaulted the old decoder, deep nesting, wrong types) get an error or
a closed connection, and the daemon stays up and keeps serving. A record from inside is marked
`from-inner` and may not claim marks that hide things.

Oracles: the daemon's pid before and after (the same process answers), a marker a wrongly
accepted `run` would write, and the journal's marks."""

import array
import json
import os
import random
import socket
import struct
import time

from envgit.daemon.client import connect
from envgit.daemon.inner_shim import frame, reply
from envgit.paths import Project


def _setup(attacker, session="agent-fz"):
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    spec = conn.request({"op": "spec", "argv": ["true"], "cwd": str(attacker.root), "env": {},
                         "session": session, "inner": True})
    return conn, spec["bwrap"][spec["bwrap"].index("/run/envgit/control.sock") - 1]


def _send_raw(path, data, fds=(), read=True):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    try:
        if fds:
            s.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            data = data[1:]
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            return None
        if not read:
            return None
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def _reply_of(raw):
    if not raw or len(raw) < 4:
        return None
    return json.loads(raw[4:4 + int.from_bytes(raw[:4], "big")])


def _alive(conn, path, pid):
    assert conn.request({"op": "status"})["pid"] == pid            # the same daemon
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(frame({"op": "status"}))
    assert "session" in reply(s)
    s.close()


def _marshal_bombs():
    """Frames like the one that crashed the old marshal decoder: list/dict/tuple type codes
    with huge element counts, truncated objects, code objects."""
    bombs = []
    for code in (b"[", b"(", b"<", b">", b"{", b"c", b"r", b"t", b"u", b"\xdb", b"\xa9"):
        for count in (0x7FFFFFFF, 0xFFFFFFFF, 0x10000000, 3):
            bombs.append(code + struct.pack("<I", count) + b"\xe9" * 8)
    bombs.append(b"\xe3" + os.urandom(154))           # a "code object" of random bytes (159 in all)
    return bombs


def test_random_and_crafted_frames_do_not_take_the_daemon_down(attacker):
    conn, path = _setup(attacker)
    pid = conn.request({"op": "status"})["pid"]
    rng = random.Random(10)
    frames = []
    for body in _marshal_bombs():
        frames.append(len(body).to_bytes(4, "big") + body)
    for _ in range(150):                                # random bodies, honest lengths
        body = rng.randbytes(rng.randrange(0, 400))
        frames.append(len(body).to_bytes(4, "big") + body)
    for _ in range(50):                                 # random lengths and bytes
        frames.append(rng.randbytes(rng.randrange(0, 64)))
    deep = b"[" * 200000 + b"]" * 200000                # recursion in the parser
    frames.append(len(deep).to_bytes(4, "big") + deep)
    for data in frames:
        _send_raw(path, data)
    _alive(conn, path, pid)
    # a huge length prefix: refused at once, nothing allocated, daemon fine
    raw = _send_raw(path, b"\xff\xff\xff\xff" + b"x" * 100)
    assert raw is None or b"limit" in raw
    raw = _send_raw(path, (64 << 20).to_bytes(4, "big"), read=False)
    # a caller that stalls mid-frame does not block others
    stalled = socket.socket(socket.AF_UNIX)
    stalled.connect(path)
    stalled.sendall((1000).to_bytes(4, "big") + b"{")
    _alive(conn, path, pid)
    stalled.close()


CRAFTED = [
    {"op": "run", "argv": "sh -c 'touch marker'", "cwd": "{root}", "env": {}},
    {"op": "run", "argv": [], "cwd": "{root}", "env": {}},
    {"op": "run", "argv": ["sh", 1, "-c"], "cwd": "{root}", "env": {}},
    {"op": "run", "argv": ["sh", "-c", "touch marker\u0000"], "cwd": "{root}", "env": {}},
    {"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": ["{root}"], "env": {}},
    {"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": "{root}", "env": {"A": 1}},
    {"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": "{root}", "env": ["A=1"]},
    {"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": "{root}", "env": {"A=B": "1"}},
    {"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": "{root}", "env": {}, "uid": 0},
    {"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": "{root}", "env": {}, "tool_call_id": {"x": 1}},
    {"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": "{root}", "env": {}, "session": "other"},
    {"op": "begin", "argv": ["sh", "-c", "touch marker"], "cwd": "{root}"},
    {"op": ["run"]},
    [1, 2, 3],
    "run",
]


def test_crafted_requests_are_refused_field_by_field(attacker):
    conn, path = _setup(attacker, "agent-cr")
    pid = conn.request({"op": "status"})["pid"]
    root = str(attacker.root)
    for msg in CRAFTED:
        text = json.dumps(msg).replace("{root}", root)
        body = text.encode()
        raw = _send_raw(path, len(body).to_bytes(4, "big") + body, fds=(0, 1, 2))
        out = _reply_of(raw)
        assert out and "error" in out, (msg, out)
    assert not (attacker.root / "marker").exists()
    _alive(conn, path, pid)
    # and the well-formed request still runs
    body = json.dumps({"op": "run", "argv": ["sh", "-c", "touch marker"], "cwd": root, "env": {}}).encode()
    out = _reply_of(_send_raw(path, len(body).to_bytes(4, "big") + body, fds=(0, 1, 2)))
    assert out.get("exit_code") == 0, out
    assert (attacker.root / "marker").exists()


def test_the_main_socket_caps_its_frames(attacker):
    """.envgit/daemon.sock is not reachable from a sandbox (marshal there, for the hot path's
    speed), but its frame size is capped: a huge length prefix closes the connection."""
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    pid = conn.request({"op": "status"})["pid"]
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(attacker.root / ".envgit" / "daemon.sock"))
    s.sendall(b"\xff\xff\xff\xff")
    data = b""
    while True:                               # an error reply (or none), then the end
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    if data:
        from envgit.daemon.client import decode
        assert "error" in decode(data[4:4 + int.from_bytes(data[:4], "big")])
    assert conn.request({"op": "status"})["pid"] == pid


def _record(path, msg):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(frame(msg))
    out = reply(s)
    s.close()
    return out


def test_a_record_from_inside_is_marked_and_cannot_claim_hiding_marks(attacker):
    conn, path = _setup(attacker, "agent-rec")
    root = str(attacker.root)
    for marks in (["refused"], ["agent-session"], ["agent-edit", "escape-route-written"], "agent-edit", [1]):
        out = _record(path, {"op": "record", "argv": ["claude:Write", f"{root}/x"], "cwd": root, "marks": marks})
        assert "error" in out, (marks, out)
    for bad in ({"body": {"k" * 100: "v"}}, {"body": {"k": "v" * 10000}}, {"body": {"k": {"nested": 1}}},
                {"argv": ["a"] * 100}, {"argv": ["a" * 5000]}, {"cwd": "/"}, {"step": 1},
                {"body": {f"k{i}": i for i in range(100)}}):
        msg = {"op": "record", "argv": ["claude:Write", f"{root}/x"], "cwd": root, **bad}
        out = _record(path, msg)
        assert "error" in out, (bad, out)
    before = json.loads(attacker.envgit("log", "--json", check=True).stdout)
    ok = _record(path, {"op": "record", "argv": ["claude:Write", f"{root}/x"], "cwd": root,
                        "marks": ["agent-edit"], "tool_call_id": "call-1",
                        "body": {"tool": "Write", "path": f"{root}/x", "claude_session": None}})
    assert "step" in ok, ok
    steps = json.loads(attacker.envgit("log", "--json", check=True).stdout)
    assert len(steps) == len(before) + 1                      # the refused ones left nothing
    step = json.loads(attacker.envgit("show", str(ok["step"]), "--json", check=True).stdout)
    assert "from-inner" in step["marks"] and "agent-edit" in step["marks"]
    notes = [e for e in step.get("events") or [] if e.get("kind") == "note"]
    assert notes and notes[0]["from"] == "inner" and notes[0]["tool"] == "Write"


def test_a_connection_flood_is_refused_and_the_daemon_serves_on(attacker):
    conn, path = _setup(attacker, "agent-fl")
    pid = conn.request({"op": "status"})["pid"]
    held = []
    for _ in range(200):                              # each stalls mid-frame
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            s.sendall(b"\x00\x00")
        except OSError:
            s.close()
            continue
        held.append(s)
    assert conn.request({"op": "status"})["pid"] == pid
    for s in held:
        s.close()
    time.sleep(0.5)
    _alive(conn, path, pid)


def test_a_step_field_of_the_wrong_type_is_a_typed_error(attacker):
    """The main socket's frames come from any process of the person's: a `step` that is a
    list, a string, a float, a bool or negative gets the daemon's own error (it raised an
    unhandled TypeError, `unhashable type`, to the client and into daemon.log)."""
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    pid = conn.request({"op": "status"})["pid"]
    for step in ([1], "1", 1.0, True, -1, {"a": 1}):
        for op in ("end", "event", "ask", "sandbox", "rewind"):
            out = conn.request({"op": op, "step": step, "kind": "note", "body": {}, "exit_code": 0})
            assert "step number" in out.get("error", ""), (op, step, out)
            assert "Traceback" not in out["error"] and "TypeError" not in out["error"], out
    assert conn.request({"op": "status"})["pid"] == pid
    log = (attacker.root / ".envgit" / "daemon.log").read_text()
    assert "unhashable" not in log and "Traceback" not in log


def test_past_the_connection_cap_a_step_says_the_daemons_own_line(attacker):
    """With the daemon's connections all taken, `envgit run` prints the daemon's reason (it
    printed `[Errno 32] Broken pipe`): the cap is lowered for the test (ENVGIT_MAX_CONNS)."""
    attacker.env["ENVGIT_MAX_CONNS"] = "2"
    attacker.run("true")
    held = []
    for _ in range(2):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(attacker.root / ".envgit" / "daemon.sock"))
        held.append(s)
    try:
        time.sleep(0.2)
        r = attacker.run("true")
        assert r.returncode != 0
        assert "already serves 2 connections" in r.stderr and "Broken pipe" not in r.stderr, r.stderr
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert attacker.run("true").returncode == 0
