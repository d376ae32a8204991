"""The daemon's auto-push: after each step, push the project to every remote set `--auto`,
in the background, never slowing a step. Standard library only (the daemon imports it).

The push runs in a process of its own (`python -m envgit.commands.remote ROOT`, nice 10): it
shares no GIL with the daemon, so encrypting and uploading cannot delay a step's snapshot or
the gate. One push at a time per project: steps that end while one runs are folded into the
next (the push uploads whatever is new by then). Its errors go to .envgit/push.log."""

import os
import subprocess
import sys
import threading

from ..importpath import PYTHON_ARGS, SPAWN_CWD, spawn_env
from . import layout

TIMEOUT_S = 3600


class AutoPush:
    def __init__(self, root: str):
        self.root = root
        self.lock = threading.Lock()
        self.dirty = False
        self.thread: threading.Thread | None = None
        self._seen: tuple | None = None     # the remotes directory as last read
        self._auto = False

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
            try:
                with open(os.path.join(self.root, ".envgit", "push.log"), "ab") as log:
                    # -P from "/", as the daemon itself is started: nothing the project holds
                    # (a planted envgit/__init__.py) is on the push's import path
                    subprocess.run([sys.executable, *PYTHON_ARGS, "-m", "envgit.commands.remote", self.root],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                   env=spawn_env(), preexec_fn=lambda: os.nice(10), timeout=TIMEOUT_S,
                                   cwd=SPAWN_CWD)
            except (OSError, subprocess.SubprocessError):
                pass
