"""A step's memory snapshot taken while the guest runs: QEMU's `background-snapshot`.

QEMU stops the guest only to save its device state and write-protect its RAM (userfaultfd
write-protect), then lets it run while its migration thread writes every touched page into
one stream file (`memory.stream`); a page the guest writes meanwhile is copied first, as it was.
So the step's end waits only for that pause, a few milliseconds, and the copy runs while the
next step does (shared/notes/vm.md measured 3-19 ms paused for 300 MB touched, where stopping
the guest for the whole copy paused it 0.4-1.1 s).

At most one runs at a time (QEMU migrates once at a time): the next snapshot, a restore, gc
and `stop` wait for it (`join`). It is committed (memstore's `ok`) only once QEMU says the
stream is complete; a daemon killed before that leaves an incomplete snapshot, never restored.

The pause is what QEMU's own STOP and RESUME events say (their timestamps), not what the
daemon saw: its QMP round trips are not the guest's.
"""

import os
import threading
import time

from . import memstore
from .machine import VMError
from .qmp import event_time

FD_NAME = "envgit-snapshot"
RESUME_WAIT_S = 30.0        # QEMU resumes the guest once its RAM is write-protected
WRITE_WAIT_S = 900.0        # the whole copy: a 4 GiB guest on a slow disk, bounded


class Refused(VMError):
    """QEMU refuses the background method itself (its capability), not one snapshot."""


def capabilities(background: bool) -> list[dict]:
    """The migration capabilities of either method: device state alone with the RAM file cloned
    (x-ignore-shared), or everything in one stream while the guest runs. QEMU refuses a
    background snapshot while postcopy-ram is set, as a restore fed page by page leaves it."""
    return [{"capability": "x-ignore-shared", "state": not background},
            {"capability": "postcopy-ram", "state": False},     # left set by a postcopy restore
            {"capability": "background-snapshot", "state": background}]


class Background:
    """One background snapshot into `dest`; `finished(info, error)` is called once, from its
    own thread, when QEMU is done: info {"bytes", "write_ms", "pause_ms"} or error (a string);
    `join` returns once it has returned."""

    def __init__(self, qmp, dest, finished):
        self.qmp = qmp
        self.dest = dest
        self.finished = finished
        self.done = threading.Event()
        self.started = threading.Event()        # start() has read the pause
        self.pause_ms: float | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> float | None:
        """Start it; returns once the guest runs again, with the pause in ms (None when QEMU's
        events did not say it). Raises Refused when QEMU refuses the method, VMError when this
        snapshot could not start."""
        mark = self.qmp.count
        try:
            self.qmp.cmd("migrate-set-capabilities", capabilities=capabilities(True))
        except VMError as e:            # this QEMU or kernel cannot: said, and not tried again
            raise Refused(str(e)) from None
        self.t0 = time.monotonic()
        fd = os.open(os.path.join(self.dest, memstore.STREAM),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            self.qmp.getfd(FD_NAME, fd)         # QEMU writes the file itself
        finally:
            os.close(fd)
        self.qmp.cmd("migrate", uri="fd:" + FD_NAME)
        self.thread = threading.Thread(target=self._wait, name="vm-background-snapshot", daemon=True)
        self.thread.start()
        try:
            stop = self.qmp.wait_event("STOP", mark, RESUME_WAIT_S)
            resume = self.qmp.wait_event("RESUME", mark, RESUME_WAIT_S) if stop else None
            if stop is not None and resume is not None:
                self.pause_ms = round((event_time(resume) - event_time(stop)) * 1000, 1)
        finally:
            self.started.set()
        return self.pause_ms

    def _wait(self):
        error = None
        deadline = time.monotonic() + WRITE_WAIT_S
        try:
            while True:
                st = self.qmp.cmd("query-migrate")
                status = st.get("status")
                if status == "completed":
                    break
                if status in ("failed", "cancelled"):
                    error = f"QEMU's background snapshot {status}: {st.get('error-desc', '')}".strip(": ")
                    break
                if time.monotonic() > deadline:
                    self.qmp.cmd("migrate_cancel")
                    error = f"QEMU's background snapshot did not finish in {WRITE_WAIT_S:.0f} s"
                    break
                time.sleep(0.01)
        except (VMError, OSError, ValueError) as e:        # QEMU gone (stopped, killed)
            error = f"QEMU stopped during the background snapshot: {e}"
        info = None
        self.started.wait(RESUME_WAIT_S * 2 + 5)
        if error is None:
            try:
                info = {"bytes": os.path.getsize(os.path.join(self.dest, memstore.STREAM)),
                        "write_ms": round((time.monotonic() - self.t0) * 1000, 1),
                        "pause_ms": self.pause_ms}
            except OSError as e:
                error = f"the background snapshot's stream: {e}"
        try:
            self.finished(info, error)
        finally:
            self.done.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for it to be done (committed or dropped); False if it was not within `timeout`
        (by default as long as the write itself may take)."""
        return self.done.wait(WRITE_WAIT_S + 30 if timeout is None else timeout)
