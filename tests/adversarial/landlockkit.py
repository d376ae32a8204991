"""What the attacks on Landlock steps share (test_landlock_*.py): a shell line running Python
inside the step, a step started in the background as an agent's tool call is (and killed as its
timeout kills it), and host sockets of every kind that record what reached them (`Ears`).
The `ll` fixture (conftest.py) gives the project on a host without user namespaces."""

import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from conftest import ENVGIT


def py(code: str) -> str:
    """A shell line running `code` with the system's python3 inside the step."""
    return f"/usr/bin/python3 -c {shlex.quote(code)}"


def start(a, script, out):
    """`envgit run -- sh -c SCRIPT` in the background, in a process group of its own (the
    client and nouserns' wrapper: what an agent's tool call is, and what its timeout kills)."""
    return subprocess.Popen(a._argv([ENVGIT, "run", "--", "sh", "-c", script]), cwd=a.root, env=a.env,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(path: Path, timeout=45.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and path.stat().st_size:
            return True
        time.sleep(0.1)
    return False


def kill_client(p):
    """The agent's timeout, the OOM killer, a closed terminal: the `envgit run` client (and
    its wrapper) killed outright, as a group."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(30)


def stop_pid_in(path: Path):
    """End the process whose pid a case's step wrote to `path` (a process this test started),
    if it is still there."""
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def remove(*paths):
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            p.unlink()


# --- the network, the host's IPC and its terminals ----------------------------------------------

class Ears:
    """What host sockets heard from a step: a TCP listener on 127.0.0.1, a UDP socket, unix
    stream and datagram socket files anyone may use, abstract unix stream and datagram sockets,
    a NETLINK_USERSOCK socket. `heard` is the oracle."""

    NETLINK_USERSOCK = 2

    def __init__(self, base: Path):
        self.heard: list[str] = []
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.path = str(base / "dgram.sock")
        self.dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.dgram.bind(self.path)
        os.chmod(self.path, 0o777)
        self.abstract_name = b"\0envgit-ll-attack-%d" % os.getpid()
        self.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.abstract.bind(self.abstract_name)
        self.netlink = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, self.NETLINK_USERSOCK)
        self.netlink.bind((0, 0))
        self.netlink_port = self.netlink.getsockname()[0]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.stream_path = str(base / "stream.sock")
        self.stream = socket.socket(socket.AF_UNIX)
        self.stream.bind(self.stream_path)
        os.chmod(self.stream_path, 0o777)
        self.stream.listen()
        self.abstract_stream_name = b"\0envgit-ll-stream-%d" % os.getpid()
        self.abstract_stream = socket.socket(socket.AF_UNIX)
        self.abstract_stream.bind(self.abstract_stream_name)
        self.abstract_stream.listen()
        self.names = {self.tcp: "tcp", self.dgram: "unix-dgram", self.abstract: "abstract-dgram",
                      self.netlink: "netlink-usersock", self.udp: "udp", self.stream: "unix-stream",
                      self.abstract_stream: "abstract-stream"}
        self.listening = (self.tcp, self.stream, self.abstract_stream)
        self.stop = False
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        socks = list(self.names)
        while not self.stop:
            ready, _, _ = select.select(socks, [], [], 0.2)
            for s in ready:
                try:
                    if s in self.listening:
                        s.accept()[0].close()
                    else:
                        s.recvmsg(4096, 4096)
                    self.heard.append(self.names[s])
                except OSError:
                    pass

    def close(self):
        self.stop = True
        self.thread.join(5)
        for s in self.names:
            s.close()
