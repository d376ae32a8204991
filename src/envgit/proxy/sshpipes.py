"""The byte plumbing of git over SSH (sshgit.py): the request frame and the fds that come
with it, a push's command list read up to its end, and the pumps between the step's fds and
the host's ssh. Every wait on a step's fd also ends when `alive()` says the caller hung up or
its step ended, and every write goes out in pieces a poll said fit: a step cannot hold a gate
thread by handing over a pipe it keeps both ends of.
"""

import contextlib
import json
import os
import select
import socket
import subprocess
import time

from ..fdpass import recv_with_fds
from ..policy.netrequest import BODY_CAP

MAX_FRAME = 64 * 1024
CHUNK = 65536
PIECE = select.PIPE_BUF      # what a write after POLLOUT takes without blocking (a pipe's)
DRAIN_CAP = 1 << 30          # a refused push's pack read and dropped, at most


class Refused(Exception):
    """One `envgit:` line for the step (the gate refused, or cannot serve, this connection)."""


def frame(obj) -> bytes:
    body = json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode()
    return len(body).to_bytes(4, "big") + body


def receive(conn) -> tuple[dict, list[int]]:
    """The request frame and the fds that came with its first bytes (at most 3 kept)."""
    data, got = recv_with_fds(conn, 4)
    try:
        if len(data) < 4:
            raise EOFError("the caller closed the connection")
        size = int.from_bytes(data, "big")
        if size > MAX_FRAME:
            raise Refused(f"envgit: ssh socket: a frame of {size} bytes is over the limit")
        msg = json.loads(exact(conn, size).decode("utf-8"))
    except BaseException:
        for fd in got:
            os.close(fd)
        raise
    return msg, got


def exact(conn, n) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError("the caller closed the connection")
        buf += chunk
    return buf


def gone(conn) -> bool:
    """Has the caller (the step's ssh shim) hung up?"""
    p = select.poll()
    p.register(conn, select.POLLIN)
    for _, ev in p.poll(0):
        if ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            return True
        try:
            if not conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return True
        except BlockingIOError:
            pass
        except OSError:
            return True
    return False


def read_commands(fd, alive) -> tuple[bytes, int | None]:
    """The start of the push from the step: (bytes read, where its command section ends, or
    None when it does not end within BODY_CAP or before the step stops sending)."""
    buf, at, p = b"", [0, 0, 1, True], select.poll()
    p.register(fd, select.POLLIN)
    while True:
        end = section_end(buf, at)
        if end is not None or len(buf) > BODY_CAP:
            return buf, end
        while not p.poll(200):
            if not alive():
                raise EOFError("the step's ssh went away")
        chunk = os.read(fd, CHUNK)
        if not chunk:
            return buf, None
        buf += chunk


def section_end(buf: bytes, at: list | None = None) -> int | None:
    """Where the command list (and the push options, when asked for) ends in `buf`; None when
    more is needed. A malformed line ends it where it stands: the judging doubts it. `at`: where
    the last call on a shorter `buf` stopped, kept in place, so each line is read once however
    the step splits its bytes (re-read from the start, four bytes at a time cost a square)."""
    i, flushes, want, first = at if at is not None else (0, 0, 1, True)
    while True:
        if at is not None:
            at[:] = i, flushes, want, first
        head = buf[i:i + 4]
        if len(head) < 4:
            return None
        try:
            n = int(head, 16)
        except ValueError:
            return i
        if n == 0:
            flushes += 1
            i += 4
            if flushes >= want:
                return i
            continue
        if n < 4:
            return i
        if i + n > len(buf):
            return None
        if first and flushes == 0 and not buf[i + 4:i + n].startswith(b"shallow "):
            caps = buf[i + 4:i + n].partition(b"\0")[2].split()     # the first command's
            if b"push-options" in caps:
                want = 2
            first = False
        i += n


def write_pieces(fd, data: bytes, alive) -> None:
    """All of `data` to `fd`, a piece at a time once poll says it fits, while alive(): a pipe
    nobody reads (its reading end passed to the daemon) would hold a blocking write forever."""
    p = select.poll()
    p.register(fd, select.POLLOUT)
    view = memoryview(data)
    while view:
        if not p.poll(200):
            if not alive():
                raise EOFError("the step's ssh went away")
            continue
        view = view[os.write(fd, view[:PIECE]):]


def pump_down(src, fd, rec, alive):
    """The server's bytes to the step's stdout, counted."""
    try:
        while True:
            chunk = src.read1(CHUNK)
            if not chunk:
                return
            write_pieces(fd, chunk, alive)
            rec["bytes_down"] += len(chunk)
    except (OSError, EOFError):
        return


def pump_up(fd, proc, rec, alive):
    """The step's bytes to the server until the step ends its input or the server exits."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    try:
        while proc.poll() is None:
            if not p.poll(200):
                if not alive():
                    return
                continue
            chunk = os.read(fd, CHUNK)
            if not chunk:
                return
            write_pieces(proc.stdin.fileno(), chunk, lambda: alive() and proc.poll() is None)
            rec["bytes_up"] += len(chunk)
    except (OSError, EOFError):
        return
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()


def refuse(fds, report: bytes, alive) -> int:
    """A refused push's report to git while its pack is read and dropped (git writes the pack
    before it reads the report), until git closes its end, the step is gone or DRAIN_CAP
    bytes were dropped (an endless stdin, /dev/zero, ends there). Returns the bytes written."""
    p = select.poll()
    p.register(fds[0], select.POLLIN)
    p.register(fds[1], select.POLLOUT)
    view, dropped, checked, sent, reading = memoryview(report), 0, time.monotonic(), 0, True
    try:
        while (view or reading) and dropped <= DRAIN_CAP:
            if time.monotonic() - checked > 0.2:       # a readable stdin never times the poll out
                if not alive():
                    break
                checked = time.monotonic()
            for fd, ev in p.poll(200):
                if fd == fds[1]:
                    n = os.write(fd, view[:PIECE])
                    view, sent = view[n:], sent + n
                    if not view:
                        p.unregister(fd)
                elif ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    chunk = os.read(fd, CHUNK)
                    dropped += len(chunk)
                    if not chunk:
                        reading = False
                        p.unregister(fd)
                    elif len(chunk) < PIECE:
                        time.sleep(0.001)    # git's pipe fills meanwhile; a timer's 8 bytes wait
    except OSError:
        pass
    return sent


def wait_ssh(proc, alive) -> int:
    """ssh's exit status; ended at once when the caller hangs up or its step ends."""
    while True:
        try:
            return proc.wait(0.2)
        except subprocess.TimeoutExpired:
            if not alive():
                proc.kill()
