"""sandbox/landlock.py, the Landlock calls the step backend for hosts without user namespaces
will use (issue 30 item 3, not wired yet): a forked child restricts itself and tries what the
ruleset allows and refuses; its answers (one word each) are the oracle. Skipped where the
kernel has no Landlock."""

import json
import os
import socket

import pytest

from envgit.sandbox import landlock

pytestmark = pytest.mark.skipif(landlock.abi() < 4, reason="this kernel has no Landlock ABI 4 (TCP rules)")


def _in_child(tmp_path, rules, tries):
    """Fork; the child applies `rules(ruleset)`, restricts itself, runs each of `tries`
    (name -> fn) and writes {name: "ok" | errno name} to a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out = {}
        try:
            rs = landlock.Ruleset(landlock.abi())
            rs.allow_path(os.path.dirname(os.__file__), landlock.READ)     # lazy stdlib imports (idna)
            rules(rs)
            rs.restrict()
            for name, fn in tries.items():
                try:
                    fn()
                    out[name] = "ok"
                except OSError as e:
                    out[name] = os.strerror(e.errno) if e.errno else str(e)
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def test_a_restricted_process_reads_and_writes_only_what_its_rules_allow(tmp_path):
    ro, rw, secret = tmp_path / "ro", tmp_path / "rw", tmp_path / "secret"
    for d in (ro, rw, secret):
        d.mkdir()
    (ro / "f").write_text("ro")
    (secret / "key").write_text("canary")

    def rules(rs):
        for p in ("/usr", "/lib", "/lib64", "/etc"):
            rs.allow_path(p, landlock.READ)
        rs.allow_path(str(ro), landlock.READ)
        rs.allow_path(str(rw), landlock.READ | landlock.WRITE)

    got = _in_child(tmp_path, rules, {
        "read ro": lambda: open(ro / "f").read(),
        "write ro": lambda: open(ro / "g", "w").close(),
        "write rw": lambda: open(rw / "g", "w").close(),
        "read secret": lambda: open(secret / "key").read(),
        "list secret": lambda: os.listdir(secret),
        "rename out": lambda: os.rename(rw / "g", secret / "g"),
        "mknod": lambda: os.mknod(rw / "null", 0o20666, os.makedev(1, 3)),
    })
    assert got["read ro"] == "ok" and got["write rw"] == "ok", got
    for name in ("write ro", "read secret", "list secret", "rename out", "mknod"):
        assert got[name] != "ok", (name, got)
    assert (secret / "key").read_text() == "canary" and not (secret / "g").exists()


def test_a_restricted_process_connects_only_to_its_port_and_binds_none(tmp_path):
    allowed, other = socket.socket(), socket.socket()
    for s in (allowed, other):
        s.bind(("127.0.0.1", 0))
        s.listen(4)
    a, o = allowed.getsockname()[1], other.getsockname()[1]
    try:
        got = _in_child(tmp_path, lambda rs: rs.allow_port(a), {
            "connect allowed": lambda: socket.create_connection(("127.0.0.1", a), 2).close(),
            "connect other": lambda: socket.create_connection(("127.0.0.1", o), 2).close(),
            "bind": lambda: socket.socket().bind(("127.0.0.1", 0)),
            "signal init": lambda: os.kill(1, 0),
        })
    finally:
        allowed.close()
        other.close()
    assert got["connect allowed"] == "ok", got
    assert got["connect other"] != "ok" and got["bind"] != "ok", got
    if landlock.abi() >= 6:         # signals scoped to the domain
        assert got["signal init"] != "ok", got
