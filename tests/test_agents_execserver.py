"""envgit's Codex exec-server spoken to directly (no Codex): the process and file calls that
Codex 0.171 does not make with empty capabilities (read, write, signal, tty) still behave
as the reference `codex exec-server` does, and every one of them is a step."""

import base64
import json
import queue
import subprocess
import sys
import threading

import pytest

from conftest import CANARY


class Wire:
    def __init__(self, proj):
        self.p = subprocess.Popen([sys.executable, "-m", "envgit.agents.execserver", "--project",
                                   str(proj.root), "--session", "codex-test"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=proj.env, cwd=proj.root)
        self.q, self.ids = queue.Queue(), iter(range(1, 10_000))
        threading.Thread(target=self._read, daemon=True).start()
        self.notes = []

    def _read(self):
        for line in self.p.stdout:
            self.q.put(json.loads(line))

    def call(self, method, **params):
        rid = next(self.ids)
        self.p.stdin.write((json.dumps({"id": rid, "method": method, "params": params}) + "\n").encode())
        self.p.stdin.flush()
        while True:
            msg = self.q.get(timeout=60)
            if msg.get("id") == rid:
                return msg
            self.notes.append(msg)

    def until(self, method, pid, timeout=60):
        for n in self.notes:
            if n["method"] == method and n["params"]["processId"] == pid:
                return n
        while True:
            msg = self.q.get(timeout=timeout)
            self.notes.append(msg)
            if msg.get("method") == method and msg["params"]["processId"] == pid:
                return msg

    def close(self):
        self.p.stdin.close()
        self.p.wait(30)


@pytest.fixture
def wire(proj):
    w = Wire(proj)
    yield w
    w.close()


def start(wire, proj, pid, argv, **kw):
    return wire.call("process/start", processId=pid, argv=argv, cwd=f"file://{proj.root}", env={},
                     metadata={"threadId": "t", "toolCallId": f"call-{pid}"}, sandbox=None, **kw)


def test_stdin_write_read_and_interrupt(wire, proj):
    assert "sessionId" in wire.call("initialize", clientName="test")["result"]
    assert start(wire, proj, "p1", ["/bin/cat"], tty=False, pipeStdin=True)["result"]["processId"] == "p1"
    w = wire.call("process/write", processId="p1", chunk=base64.b64encode(b"abc\n").decode(), writeId="w1")
    assert w["result"] == {"status": "accepted"}
    r = wire.call("process/read", processId="p1", afterSeq=0, maxBytes=1000, waitMs=20000)["result"]
    assert b"".join(base64.b64decode(c["chunk"]) for c in r["chunks"]) == b"abc\n"
    assert r["nextSeq"] == r["chunks"][-1]["seq"] + 1 and not r["exited"]
    assert wire.call("process/signal", processId="p1", signal="interrupt")["result"] == {}
    exited = wire.until("process/exited", "p1")["params"]
    closed = wire.until("process/closed", "p1")["params"]
    assert exited["exitCode"] == 130 and closed["seq"] == exited["seq"] + 1
    assert wire.call("process/write", processId="nope", chunk="", writeId="w2")["result"] == \
        {"status": "unknownProcess"}
    assert wire.call("process/read", processId="nope", afterSeq=0)["error"]["code"] == -32600
    assert wire.call("process/signal", processId="p1", signal="SIGTERM")["error"]["code"] == -32602
    assert wire.call("nope/nothing")["error"]["code"] == -32601
    step, = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert step["argv"] == ["/bin/cat"] and step["tool_call_id"] == "call-p1" and step["session"] == "codex-test"


def test_tty_and_terminate(wire, proj):
    start(wire, proj, "p2", ["/bin/sh", "-c", "test -t 0 && test -t 1 && echo on-a-terminal; sleep 30"],
          tty=True, pipeStdin=False)
    out = wire.until("process/output", "p2")["params"]
    assert out["stream"] == "pty" and base64.b64decode(out["chunk"]) == b"on-a-terminal\r\n"
    assert wire.call("process/terminate", processId="p2")["result"] == {"running": True}
    assert wire.until("process/exited", "p2")["params"]["exitCode"] != 0
    assert wire.call("process/terminate", processId="p2")["result"] == {"running": False}


def test_file_calls_are_steps_under_the_policy(wire, proj):
    d = proj.root / "d1"
    assert wire.call("fs/createDirectory", path=f"file://{d}/d2", recursive=True)["result"] == {}
    data = base64.b64encode(b"hello\n").decode()
    assert wire.call("fs/writeFile", path=f"file://{d}/d2/a.txt", dataBase64=data)["result"] == {}
    assert wire.call("fs/copy", sourcePath=f"file://{d}/d2/a.txt", destinationPath=f"file://{d}/b.txt",
                     recursive=False)["result"] == {}
    entries = wire.call("fs/readDirectory", path=f"file://{d}")["result"]["entries"]
    assert sorted((e["fileName"], e["isDirectory"]) for e in entries) == [("b.txt", False), ("d2", True)]
    assert wire.call("fs/readFile", path=f"file://{d}/b.txt")["result"]["dataBase64"] == data
    meta = wire.call("fs/getMetadata", path=f"file://{d}/b.txt")["result"]
    assert meta["isFile"] and meta["size"] == 6
    assert wire.call("fs/remove", path=f"file://{d}", recursive=True, force=True)["result"] == {}
    assert not d.exists()
    key = proj.home / ".ssh" / "id_ed25519"
    denied = wire.call("fs/readFile", path=f"file://{key}")
    assert denied["error"]["code"] == -32004 and CANARY not in json.dumps(denied)
    assert "deny_read ~/.ssh" in wire.call("fs/getMetadata", path=f"file://{key}")["error"]["message"]
    outside = proj.home / "x.txt"
    assert wire.call("fs/writeFile", path=f"file://{outside}", dataBase64=data)["error"]["code"] == -32603
    assert not outside.exists()
    argv0 = [s["argv"][0] for s in json.loads(proj.envgit("log", "--json", check=True).stdout)]
    assert argv0 == ["mkdir", "sh", "cp", "find", "cat", "rm", "cat", "sh"]


def test_the_requested_env_is_the_steps_not_the_host_launchers(wire, proj, tmp_path):
    """process/start's env reaches the command inside as the policy passes it, and never the
    host-side launcher: a PYTHONPATH with a sitecustomize.py in it does not run on the host."""
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "sitecustomize-ran"
    (planted / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    proj.write_policy("version: 1\nenv:\n  pass: [MODEL_SET_VAR]\n")
    r = wire.call("process/start", processId="e1", argv=["sh", "-c", "echo var=$MODEL_SET_VAR home=$HOME"],
                  cwd=f"file://{proj.root}", env={"PYTHONPATH": str(planted), "MODEL_SET_VAR": "hello",
                                                  "HOME": str(tmp_path)},
                  metadata={"threadId": "t", "toolCallId": "call-e1"}, sandbox=None, tty=False)
    assert r["result"]["processId"] == "e1", r
    assert wire.until("process/exited", "e1")["params"]["exitCode"] == 0
    out = wire.call("process/read", processId="e1", afterSeq=0, maxBytes=100000, waitMs=1000)["result"]
    text = b"".join(base64.b64decode(c["chunk"]) for c in out["chunks"]).decode()
    assert "var=hello" in text, text                      # an ordinary variable still reaches the step
    assert f"home={proj.home}\n" in text, text           # HOME, which decides the view, is the session's
    assert not marker.exists()                            # PYTHONPATH acted on no host process
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert [s["tool_call_id"] for s in steps if s["argv"][:2] == ["sh", "-c"]] == ["call-e1"]
