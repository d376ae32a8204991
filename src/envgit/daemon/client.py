"""Talking to the session daemon, starting it when it is not running. Standard library only."""

import json
import os
import socket
import sys
import time

START_TIMEOUT_S = 30


class DaemonError(Exception):
    pass


class Conn:
    def __init__(self, sock):
        self.sock = sock
        self.file = sock.makefile("rb")

    def request(self, obj) -> dict:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")
        line = self.file.readline()
        if not line:
            raise DaemonError("the session daemon closed the connection (see .envgit/daemon.log)")
        return json.loads(line)

    def close(self):
        self.file.close()
        self.sock.close()


def _try(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return s
    except OSError:
        s.close()
        return None


def connect(project, start: bool = True) -> Conn:
    s = _try(project.socket)
    if s is None and start:
        _spawn(project)
        deadline = time.monotonic() + START_TIMEOUT_S
        while s is None and time.monotonic() < deadline:
            time.sleep(0.02)
            s = _try(project.socket)
    if s is None:
        raise DaemonError(f"no session daemon answers on {project.socket}; "
                          f"see {project.state_path('daemon.log')}")
    return Conn(s)


def _spawn(project):
    import subprocess   # only when the daemon has to be started
    log = open(project.state_path("daemon.log"), "ab")
    subprocess.Popen([sys.executable, "-m", "envgit.daemon", project.root],
                     stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                     start_new_session=True, close_fds=True, cwd=project.root)
    log.close()
