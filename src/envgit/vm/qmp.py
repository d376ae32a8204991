"""QEMU's machine protocol (QMP), as the VM tier speaks it: one JSON object a line each way.

Commands may come from two threads at once (a step's operation, and the thread that waits for
a background snapshot to finish: background.py), so a command and its reply are one critical
section. Events QEMU sends between replies (STOP, RESUME, MIGRATION) are kept, in order, for
`wait_event`: a background snapshot's pause is the time between its STOP and RESUME, as QEMU
timestamps them.
"""

import array
import json
import socket
import threading
import time

from .machine import VMError, connect_unix

EVENTS_KEPT = 64


class QMP:
    def __init__(self, path, timeout=30):
        self.sock = connect_unix(path, timeout)
        self.sock.settimeout(timeout)
        self.buf = b""
        self.lock = threading.Lock()
        self.events: list[tuple[int, dict]] = []     # (its number, the event), the last 64
        self.count = 0                                  # events received so far
        self._line()                    # the greeting
        self.cmd("qmp_capabilities")

    def _line(self):
        while b"\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise VMError("QEMU's QMP socket closed")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def _keep(self, msg):
        self.count += 1
        self.events.append((self.count, msg))
        del self.events[:-EVENTS_KEPT]

    def cmd(self, name, **args):
        with self.lock:
            self.sock.sendall(json.dumps({"execute": name, **({"arguments": args} if args else {})}).encode()
                              + b"\n")
            while True:
                msg = self._line()
                if "return" in msg:
                    return msg["return"]
                if "error" in msg:
                    raise VMError(f"QEMU {name}: {msg['error'].get('desc')}")
                if "event" in msg:
                    self._keep(msg)

    def getfd(self, name: str, fd: int):
        """QEMU takes a duplicate of `fd` under `name` (SCM_RIGHTS on this socket): a migration
        to or from `fd:NAME` then reads or writes the file itself, no shell or pipe between."""
        msg = json.dumps({"execute": "getfd", "arguments": {"fdname": name}}).encode() + b"\n"
        with self.lock:
            self.sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
            while True:
                got = self._line()
                if "return" in got:
                    return
                if "error" in got:
                    raise VMError(f"QEMU getfd: {got['error'].get('desc')}")
                if "event" in got:
                    self._keep(got)

    def wait_event(self, name, after: int, timeout: float) -> dict | None:
        """The first event `name` numbered above `after` (self.count read before the command
        that causes it), waiting up to `timeout` s; None if none came."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                for n, msg in self.events:
                    if n > after and msg.get("event") == name:
                        return msg
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.sock.settimeout(min(left, 0.05))
                try:
                    self._keep(self._line())
                except TimeoutError:
                    pass
                finally:
                    self.sock.settimeout(30)

    def close(self):
        self.sock.close()


def event_time(msg) -> float:
    """An event's timestamp, in seconds (QEMU's own clock: the host's realtime)."""
    ts = msg.get("timestamp") or {}
    return ts.get("seconds", 0) + ts.get("microseconds", 0) / 1e6
