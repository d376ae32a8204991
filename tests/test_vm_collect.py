"""The guest agent's write-back (vm/agent.py `collect`), in process: a file the guest could not
read when a step ended is not taken as synced, so its change reaches the host at the next
collect once it can be read. The guest runs steps as root without DAC override, so a step's
`chmod 000` makes its own file unreadable there; here, as root, that refusal cannot happen, so
the test makes `os.open` refuse that one path (a mock of the guest's refusal, and only that).
The VM tier's end-to-end tests (tests/test_vm.py) drive the real guest."""

import json
import os

from envgit.vm import wire
from envgit.vm.agent import Agent


def _agent(root, fd):
    a = Agent.__new__(Agent)            # no listener, no signal handlers: collect only
    a.port, a.root, a.manifest = fd, str(root), {}
    return a


def _sent_paths(r):
    reader, out = wire.Reader(), []
    reader.feed(os.read(r, 1 << 20))
    for kind, _channel, payload in reader.frames():
        if kind == wire.CHANGE:
            out.append(json.loads(payload.split(b"\n", 1)[0])["path"])
    return out


def test_a_file_the_guest_could_not_read_is_sent_at_the_next_collect(tmp_path, monkeypatch):
    r, w = os.pipe()
    (tmp_path / "kept.txt").write_text("one\n")
    a = _agent(tmp_path, w)
    a.collect(0)
    assert _sent_paths(r) == ["kept.txt"]
    (tmp_path / "kept.txt").write_text("two, then chmod 000\n")
    real_open = os.open

    def refuse(path, flags, *rest, **kw):
        if str(path).endswith("kept.txt") and not flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *rest, **kw)
    monkeypatch.setattr(os, "open", refuse)
    a.collect(0)
    assert _sent_paths(r) == []                     # could not be read: nothing sent
    monkeypatch.setattr(os, "open", real_open)
    a.collect(0)
    assert _sent_paths(r) == ["kept.txt"]           # sent once it can be read
