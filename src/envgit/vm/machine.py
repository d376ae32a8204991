"""The VM tier's one backend interface, and the link to the guest agent every backend shares.

A backend (qemu.py today; Firecracker or cloud-hypervisor where installed would be another
class with these five methods) gives:

  boot()                 start a fresh guest and wait until its agent answers
  run(req, io) -> (code, signal)
                         one command in the guest with the caller's streams (machine.Link.run)
  snapshot(dest) -> {"pause_ms", "bytes", ...}
                         the guest's memory and device state written into directory `dest`
                         (the guest paused meanwhile, running again after)
  restore(src)           the guest as it was at snapshot `src`, running (same processes)
  stop()                 the guest gone

The agent speaks wire.py's frames over one byte stream (a virtio-serial port, here a unix
socket chardev on the host); Link multiplexes it by channel, one channel per request.
"""

import itertools
import json
import os
import queue
import socket
import threading
import time

from . import wire


class VMError(Exception):
    pass


class Machine:
    """What every backend implements (see the module's docstring)."""

    accel = "none"           # "kvm" or "tcg": said by doctor and the first step

    def boot(self):
        raise NotImplementedError

    def run(self, req, io):
        return self.link.run(req, io)

    def snapshot(self, dest) -> dict:
        raise NotImplementedError

    def restore(self, src) -> dict:
        raise NotImplementedError

    def stop(self):
        raise NotImplementedError


class Link:
    """The host end of the agent's port: frames in and out, demultiplexed by channel."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.queues: dict[int, queue.Queue] = {}
        self.ids = itertools.count(1)
        self.closed = False
        self.gate_socket = None        # the gate's unix socket, while a step has network
        self.net: dict[int, socket.socket] = {}
        self.thread = threading.Thread(target=self._read, name="vm-agent-link", daemon=True)
        self.thread.start()

    def send(self, kind, payload=b"", channel=0):
        with self.lock:
            self.sock.sendall(wire.pack(kind, payload, channel))

    def channel(self) -> int:
        ch = next(self.ids)
        self.queues[ch] = queue.Queue()
        return ch

    def release(self, ch):
        self.queues.pop(ch, None)

    def _read(self):
        r = wire.Reader()
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                r.feed(data)
                for kind, ch, payload in r.frames():
                    if ch >= wire.NET_BASE:
                        self._net(kind, ch, payload)
                        continue
                    q = self.queues.get(ch)
                    if q is not None:
                        q.put((kind, payload))
        except (OSError, ValueError):
            pass
        self.closed = True
        for q in list(self.queues.values()):
            q.put((None, b""))

    # --- the guest's connections to its proxy port, each one a connection to the gate -------

    def _net(self, kind, ch, payload):
        if kind == wire.NET_OPEN:
            path = self.gate_socket
            if not path:                # no step with network now: nothing to reach
                self.send(wire.NET_CLOSE, b"", ch)
                return
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
            except OSError:
                s.close()
                self.send(wire.NET_CLOSE, b"", ch)
                return
            self.net[ch] = s
            threading.Thread(target=self._net_pump, args=(ch, s), name="vm-net", daemon=True).start()
        elif kind == wire.NET_DATA:
            s = self.net.get(ch)
            if s is not None:
                try:
                    s.sendall(payload)
                except OSError:
                    self._net_end(ch)
        elif kind == wire.NET_CLOSE:
            s = self.net.get(ch)
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def _net_pump(self, ch, s):
        try:
            while True:
                data = s.recv(1 << 16)
                if not data:
                    break
                self.send(wire.NET_DATA, data, ch)
        except OSError:
            pass
        try:
            self.send(wire.NET_CLOSE, b"", ch)
        except OSError:
            pass
        self._net_end(ch)

    def _net_end(self, ch):
        s = self.net.pop(ch, None)
        if s is not None:
            s.close()

    def get(self, ch, timeout):
        """The channel's next frame; (None, None) after `timeout`, at once when the port is
        closed and nothing is left (a channel opened after the reader ended gets no sentinel)."""
        q = self.queues.get(ch)
        if q is None:
            return (None, None)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return q.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                if self.closed or time.monotonic() >= deadline:
                    return (None, None)

    def ping(self, timeout) -> bool:
        ch = self.channel()
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                self.send(wire.PING, b"p", ch)
                kind, _ = self.get(ch, 0.5)
                if kind == wire.DONE:
                    return True
                if self.closed:
                    return False
            return False
        finally:
            self.release(ch)

    def call(self, kind, payload: bytes, timeout=120.0, on_frame=None):
        """Send one request and collect its answer up to DONE (or ERROR: raised)."""
        ch = self.channel()
        try:
            self.send(kind, payload, ch)
            deadline = time.monotonic() + timeout
            while True:
                k, p = self.get(ch, max(0.1, deadline - time.monotonic()))
                if k is None:
                    raise VMError("the guest agent did not answer" if not self.closed
                                  else "the guest agent's port closed")
                if k == wire.DONE:
                    return
                if k == wire.ERROR:
                    raise VMError("guest agent: " + p.decode(errors="replace"))
                if on_frame:
                    on_frame(k, p)
        finally:
            self.release(ch)

    def run(self, req: dict, io) -> tuple[int, int]:
        """One command: `io` is told each output frame (io.out(kind, data)) and is asked for
        input (io.pump(send) runs on its own thread, sending STDIN/EOF/SIGNAL/WINSIZE)."""
        ch = self.channel()
        try:
            self.send(wire.RUN, json.dumps(req).encode(), ch)
            stop = threading.Event()
            pump = threading.Thread(target=io.pump, args=(lambda k, p=b"": self.send(k, p, ch), stop),
                                    name="vm-step-input", daemon=True)
            pump.start()
            try:
                while True:
                    k, p = self.get(ch, 3600)
                    if k is None:
                        if self.closed:
                            return 125, 0
                        continue
                    if k == wire.EXIT:
                        return wire.read_exit(p)
                    if k == wire.ERROR:
                        io.out(wire.STDERR, b"envgit: the guest could not run the command: " + p + b"\n")
                        return 125, 0
                    io.out(k, p)
            finally:
                stop.set()
        finally:
            self.release(ch)

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def connect_unix(path, timeout) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise VMError(f"{path}: nobody answers") from None
            time.sleep(0.005)


def remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
