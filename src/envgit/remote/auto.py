"""The daemon's auto-push: after each step, push the project to every remote set `--auto`,
in the background, never slowing a step. Standard library only (the daemon imports it).

The push runs in a process of its own (`python -m envgit.commands.remote --serve ROOT`, nice
10): it shares no GIL with the daemon, so encrypting and uploading cannot delay a step's
snapshot or the gate. That process stays while pushes keep coming (a line "push" on its input
for each, a line "done N" back): the interpreter's start and boto3's import, most of a small
push's time, are paid once, not per push; it is let go after IDLE_S without a push and when
the daemon stops (its input closed). One push at a time per project: steps that end while one
runs are folded into the next (the push uploads whatever is new by then). Its errors go to
.envgit/push.log."""

import os
import select
import subprocess
import sys
import threading
import time

from ..importpath import PYTHON_ARGS, SPAWN_CWD, spawn_env
from . import layout

TIMEOUT_S = 3600
IDLE_S = 600          # a worker with no push this long is let go


class AutoPush:
    def __init__(self, root: str):
        self.root = root
        self.lock = threading.Lock()
        self.dirty = False
        self.thread: threading.Thread | None = None
        self._seen: tuple | None = None     # the remotes directory as last read
        self._auto = False
        self.worker: subprocess.Popen | None = None     # the resident push process
        self.last_push = 0.0

    def _any_auto(self) -> bool:
        """Is any remote set --auto? Read again only when the remotes directory changed (a
        remote added, set or removed is a file written whole and renamed into it)."""
        try:
            st = os.stat(layout.config_dir())
        except OSError:
            return False
        key = (st.st_ino, st.st_mtime_ns)
        if key != self._seen:
            self._seen, self._auto = key, bool(layout.auto_remotes())
        return self._auto

    def step_ended(self) -> None:
        """Called by the daemon as a step's end entry is written: returns at once (and with no
        remote set --auto, having started nothing: a thread a step was a millisecond of it)."""
        if not self._any_auto():
            return
        with self.lock:
            self.dirty = True
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="envgit-autopush", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.dirty:
                    self.thread = None
                    return
                self.dirty = False
            if not layout.auto_remotes():
                continue
            for _ in range(2):              # a worker that died since its last push: once more
                if self._push_once():
                    break

    def _push_once(self) -> bool:
        """One push by the resident worker (started if there is none): False if it was gone."""
        w = self.worker
        if w is None or w.poll() is not None:
            try:
                with open(os.path.join(self.root, ".envgit", "push.log"), "ab") as log:
                    # -P from "/", as the daemon itself is started: nothing the project holds
                    # (a planted envgit/__init__.py) is on the push's import path
                    w = self.worker = subprocess.Popen(
                        [sys.executable, *PYTHON_ARGS, "-m", "envgit.commands.remote", "--serve", self.root],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=spawn_env(),
                        preexec_fn=lambda: os.nice(10), cwd=SPAWN_CWD)
            except OSError:
                return True                 # cannot start: said by nothing, tried after the next step
        assert w.stdin is not None and w.stdout is not None
        try:
            w.stdin.write(b"push\n")
            w.stdin.flush()
            ready, _, _ = select.select([w.stdout], [], [], TIMEOUT_S)
            line = w.stdout.readline() if ready else b""
        except (OSError, ValueError):
            line = b""
        if not line.startswith(b"done"):
            self._stop_worker()
            return False
        self.last_push = time.monotonic()
        return True

    def idle_check(self) -> None:
        """Let the worker go after IDLE_S without a push (the daemon's idle watch calls this)."""
        with self.lock:
            if self.worker is not None and self.thread is None and time.monotonic() - self.last_push > IDLE_S:
                self._stop_worker()

    def _stop_worker(self) -> None:
        w, self.worker = self.worker, None
        if w is None:
            return
        try:
            if w.stdin is not None:
                w.stdin.close()             # its loop ends at end of input
            w.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            w.kill()
            w.wait()

    def close(self) -> None:
        """The daemon stops: the worker goes with it (a push under way is let finish, 30 s)."""
        with self.lock:
            t = self.thread
        if t is not None:
            t.join(timeout=30)
        with self.lock:
            self._stop_worker()
