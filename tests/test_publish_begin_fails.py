"""A step's ports are listened for before its begin entry is written; when that write fails
(the disk full, a damaged journal) the step never begins and its listeners must close with it:
the host port is free again, not held by the daemon until it exits."""

import asyncio
import socket
import time
from types import SimpleNamespace

import pytest

from envgit.daemon import steps
from envgit.daemon.learn import LearnState
from envgit.paths import Project
from envgit.policy.load import load_policy
from envgit.sandbox import backend
from kit.ports import free_port as _free_port


class FullJournal:
    def begin_step(self, head):
        raise OSError(28, "No space left on device")


def test_a_step_whose_begin_cannot_be_written_leaves_no_port_listened_on(tmp_path, monkeypatch):
    (tmp_path / "envgit.yaml").write_text("version: 1\n")

    async def settled(*args, **kwargs):
        return None
    monkeypatch.setattr(steps, "settle", settled)
    # which sandbox this host gives is decided by starting bwrap once (sandbox/backend.py): a
    # quick test starts no process, and this one is about the listeners, under bubblewrap
    monkeypatch.setattr(backend, "_chosen", [backend.BWRAP])
    pol = load_policy(tmp_path / "envgit.yaml")
    sess = SimpleNamespace(project=Project(str(tmp_path)), policy=lambda: pol, id="s1",
                           journal=FullJournal(), pending_baseline=None, live={}, learn=LearnState())
    port = _free_port()
    with pytest.raises(OSError):
        asyncio.run(steps.begin(sess, {"argv": ["true"], "cwd": str(tmp_path), "publish": [str(port)]}))
    with socket.socket() as s:              # free again: nothing listens there
        s.bind(("127.0.0.1", port))
    left = tmp_path / ".envgit" / "publish"
    deadline = time.monotonic() + 10          # its directory goes in a thread
    while list(left.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(left.iterdir())
