"""A real pseudo-terminal to type into: what a person at a terminal does to `envgit run`.

    with Term([ENVGIT, "run", "--", "bash", "-i"], cwd, env) as t:
        t.expect(b"PROMPT$ ")
        t.send(b"echo hi\\r")
        status = t.wait()

`status` is the wait status of the process started on the terminal (os.WIFSIGNALED and the
rest apply); `t.text` is everything the terminal showed. Every wait is bounded: on timeout the
process is killed and the test sees the output so far.
"""

import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time


class Term:
    def __init__(self, argv, cwd, env, rows=24, cols=80):
        self.out = b""
        self.status = None
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                # the size set here, before the command runs: set from the parent, a fast child
                # could read 0x0 first (`stty -a` differed before and after the step)
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                os.chdir(cwd)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)

    @property
    def text(self) -> str:
        return self.out.decode(errors="replace")

    def _pump(self, wait):
        ready, _, _ = select.select([self.fd], [], [], wait)
        if ready:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:            # EIO: every process on the terminal is gone
                chunk = b""
            self.out += chunk
            return bool(chunk)
        return True

    def expect(self, what: bytes, timeout=30) -> bool:
        """Read until `what` has been shown after everything expected before (True), or the
        process ended or `timeout` passed (False)."""
        start = getattr(self, "_seen", 0)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            i = self.out.find(what, start)
            if i >= 0:
                self._seen = i + len(what)
                return True
            if not self._pump(0.1) and self.out.find(what, start) < 0:
                return False
        return False

    def send(self, data: bytes, settle=0.2):
        time.sleep(settle)              # let the reader get to its read (as a person would)
        os.write(self.fd, data)

    def wait(self, timeout=60) -> int:
        end = time.monotonic() + timeout
        while self.status is None and time.monotonic() < end:
            self._pump(0.1)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = status
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            _, self.status = os.waitpid(self.pid, 0)
        while self._pump(0.05) and select.select([self.fd], [], [], 0)[0]:
            pass
        return self.status

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            _, self.status = os.waitpid(self.pid, 0)
        os.close(self.fd)


def exit_code(status) -> int | None:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else None


def died_of(status) -> int | None:
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
