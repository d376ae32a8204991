"""A step that publishes a port owns the directory of its socket files (sandbox/publish.py): it
tries to make the daemon's listener on the host join the person's connections to something
else of the host's: its socket file swapped for a link to a unix socket the host serves, or for
a FIFO or a plain file. The oracle is the host's own server: it must never be connected to, and
the daemon must keep serving (a later connection to a real socket file still works)."""

import os
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import ENVGIT
from kit.ports import free_port as _free_port

pytestmark = pytest.mark.both_uids("the socket files are written by the step's uid and opened by the daemon's")


class HostSocketServer:
    """A unix socket server on the host, in a directory any user may reach: counts connections."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="envgit-host-sock-")
        os.chmod(self.dir, 0o755)
        self.path = os.path.join(self.dir, "host.sock")
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o777)
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            c.sendall(b"HTTP/1.0 200 OK\r\n\r\nHOST-SECRET\n")
            c.close()

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        self.sock.close()


def _ask(port):
    """What the host's 127.0.0.1:PORT answers a request with (b"" for nothing)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            c.settimeout(5)
            data = b""
            while chunk := c.recv(4096):
                data += chunk
            return data
    except OSError:
        return b""


def test_a_step_cannot_point_its_published_socket_at_the_hosts(attacker):
    host = HostSocketServer()
    port = _free_port()
    sock = f"/run/envgit/publish/{port}.sock"
    # the step waits for its listener's socket file, then replaces it, in turn, with a link to
    # the host's socket, a FIFO and a plain file, and last serves a real answer of its own
    script = (f"while [ ! -S {sock} ]; do sleep 0.05; done; "
              f"rm -f {sock}; ln -s {host.path} {sock}; touch linked; "
              "while [ ! -f go-fifo ]; do sleep 0.05; done; "
              f"rm -f {sock}; mkfifo {sock}; touch fifo; "
              "while [ ! -f go-file ]; do sleep 0.05; done; "
              f"rm -f {sock}; echo x > {sock}; touch file; "
              "while [ ! -f go-own ]; do sleep 0.05; done; "
              f"rm -f {sock}; echo own > own.txt; "
              f"python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & "
              f"socat UNIX-LISTEN:{sock},fork TCP4:127.0.0.1:{port} & "
              "while [ ! -f done ]; do sleep 0.05; done; kill %1 %2")
    argv = [ENVGIT, "run", "-p", str(port), "--", "sh", "-c", script]
    if attacker.user:
        argv = ["runuser", "-u", attacker.user, "--", *argv]
    p = subprocess.Popen(argv, cwd=attacker.root, env=attacker.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)

    def wait_for(name):
        end = time.monotonic() + 60
        while not (attacker.root / name).exists():
            assert time.monotonic() < end and p.poll() is None, (name, p.poll())
            time.sleep(0.05)

    def go(name):
        (attacker.root / name).write_text("")
        attacker.own(attacker.root / name)

    try:
        wait_for("linked")
        assert b"HOST-SECRET" not in _ask(port)
        go("go-fifo")
        wait_for("fifo")
        assert b"HOST-SECRET" not in _ask(port)       # and the daemon does not hang on a FIFO
        go("go-file")
        wait_for("file")
        assert b"HOST-SECRET" not in _ask(port)
        go("go-own")
        deadline = time.monotonic() + 30
        answer = b""
        while b"200 OK" not in answer and time.monotonic() < deadline:
            answer = _ask(port)
            time.sleep(0.2)
        assert b"200 OK" in answer                     # the daemon still serves the step's own
        go("done")
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        host.close()
    assert host.accepted == 0
