"""Talking to the session daemon, starting it when it is not running. Standard library only.

Frames are a 4-byte big-endian length and a `marshal` dump of a dict of plain values.
Both choices are for the start-up of every step: `json` imports `re` (~5 ms), and the
`socket` wrapper imports selectors and enum, for nothing a framed protocol over one unix
socket needs. The socket is mode 0600 inside .envgit/: only the user's own processes speak
on it, and no sandbox can see it."""

import _socket
import marshal
import os
import sys
import time

from ..paths import UnixAddress

MAX_FRAME = 64 * 1024 * 1024


def encode(obj) -> bytes:
    body = marshal.dumps(obj, 4)
    return len(body).to_bytes(4, "big") + body


def decode(body: bytes):
    obj = marshal.loads(body)
    if not isinstance(obj, dict):
        raise ValueError("a frame must hold a dict")
    return obj

# The frames' meaning, as one number both ends say in `hello`: a daemon and a client of two
# builds that differ in any op's fields must not talk (a reply missing a field is a traceback in
# the client, a request missing one an internal error in the daemon). Bump it when an op's
# request or reply changes; a daemon from before the number existed says none.
PROTOCOL = 2

START_TIMEOUT_S = 30
STOPPING_WAIT_S = 60    # a stopping daemon waits 20 s at most for a VM snapshot (vm/qemu.py)
STOP_TIMEOUT_S = 15
try:        # how long a connected daemon may take to say its first word (a wedged or full one)
    ANSWER_TIMEOUT_S = float(os.environ.get("ENVGIT_DAEMON_ANSWER_TIMEOUT", "10"))
except ValueError:
    ANSWER_TIMEOUT_S = 10.0


class DaemonError(Exception):
    pass


class Conn:
    """One connection. Frames with a "push" key (asks, notices) may arrive at any time while
    a step runs; `request` hands them to `on_push` and returns the reply to its own request."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.on_push = None
        self._rid = 0
        self.greeting: dict = {}     # the daemon's reply to `hello` (its "protocol")

    def request(self, obj) -> dict:
        self._rid += 1
        try:
            self.send({**obj, "rid": self._rid})
        except (BrokenPipeError, ConnectionResetError):
            # The daemon closed first; it may have said why (its connection cap) before it did.
            raise DaemonError(self._last_error() or "the session daemon closed the connection "
                              "(see .envgit/daemon.log)") from None
        while True:
            frame = self.read_frame()
            if "push" in frame:
                if self.on_push:
                    self.on_push(frame)
            elif frame.get("rid") == self._rid:
                return frame          # (replies to answers sent meanwhile are skipped)
            elif "rid" not in frame and "error" in frame:   # said to the connection, then closed
                raise DaemonError(str(frame["error"]).removeprefix("envgit: "))

    def _last_error(self) -> str | None:
        """An error frame the daemon sent before closing, if one is there to read."""
        try:
            self.sock.settimeout(1)
            frame = self.read_frame()
        except (OSError, ValueError, DaemonError):
            return None
        return str(frame["error"]).removeprefix("envgit: ") if isinstance(frame, dict) and "error" in frame else None

    def send(self, obj):
        self.sock.sendall(encode(obj))

    def read_frame(self) -> dict:
        size = int.from_bytes(self._read(4), "big")
        if size > MAX_FRAME:
            raise DaemonError(f"the session daemon sent a {size}-byte frame")
        return decode(self._read(size))

    def has_frame(self) -> bool:
        """A whole frame is already buffered (select() would not wake for it)."""
        return len(self.buf) >= 4 and len(self.buf) >= 4 + int.from_bytes(self.buf[:4], "big")

    def fill(self) -> bool:
        """Read what the socket has (it is readable); False at end of stream."""
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                raise DaemonError("the session daemon closed the connection (see .envgit/daemon.log)")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def close(self):
        self.sock.close()


def _try(path):
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        with UnixAddress(path) as addr:
            s.connect(addr)
        return s
    except OSError:
        s.close()
        return None


def connect(project, start: bool = True, any_build: bool = False) -> Conn:
    """A connection to the project's session daemon (started when none runs and `start`).
    A daemon of another build (another PROTOCOL) is stopped and this build's started when it
    runs no step, said on stderr; with steps running it is an error saying what to do.
    `any_build`: whatever build answers (`envgit daemon status|stop`)."""
    conn = _connect(project, start)
    theirs = conn.greeting.get("protocol")
    if any_build or theirs == PROTOCOL:
        return conn
    return _other_build(conn, project, theirs, start)


def _other_build(conn, project, theirs, start) -> Conn:
    said = f"protocol {theirs}" if theirs is not None else "from before protocol numbers"
    status = conn.request({"op": "status"})
    live = status.get("live") or []
    if live or not start:
        conn.close()
        steps = ", ".join(str(s) for s in live)
        raise DaemonError(
            f"the session daemon running for this project is another build of envgit ({said}; "
            f"this one speaks protocol {PROTOCOL})"
            + (f" and step{'s' if len(live) > 1 else ''} {steps} still run in it" if live else "")
            + ": let them end, then `envgit daemon stop`; the next command starts this build's")
    conn.request({"op": "stop"})
    conn.close()
    pid = status.get("pid")
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _alive(pid):
        raise DaemonError(f"the session daemon of another build (pid {pid}) did not stop in "
                          f"{STOP_TIMEOUT_S} s; run `envgit daemon stop` and retry")
    sys.stderr.write(f"envgit: the session daemon was another build of envgit ({said}); "
                     f"stopped it and started this one's\n")
    fresh = _connect(project, start)
    if fresh.greeting.get("protocol") != PROTOCOL:      # two builds racing to start theirs
        fresh.close()
        raise DaemonError("another build of envgit started its session daemon for this project "
                          "meanwhile; run one build at a time (`envgit daemon stop`, then retry)")
    return fresh


def lock_held(project) -> bool:
    """Does a daemon hold daemon.lock? Read from /proc/locks, never by taking the lock: a
    client holding it for an instant would make a daemon starting meanwhile give up."""
    return lock_holder(project) is not None


def lock_holder(project) -> int | None:
    """The pid that took the flock on daemon.lock (as /proc/locks says), or None."""
    try:
        st = os.stat(project.state_path("daemon.lock"))
        with open("/proc/locks") as f:
            locks = f.read()
    except OSError:
        return None
    me = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    for line in locks.splitlines():
        if " FLOCK " in line and me in line:
            fields = line.split()
            pid = fields[fields.index(me.strip()) - 1]
            return int(pid) if pid.isdigit() else 0
    return None


def exiting(pid) -> bool:
    """Is this process dying (PF_EXITING in its stat flags, or a zombie)? A daemon killed with
    -9 holds its lock until its last thread has closed every file; closing an inotify
    descriptor waits for the kernel's grace period, so that can be long after its clients
    saw their connections close."""
    if not pid or pid < 0:
        return False                     # not in this pid namespace: nothing to wait on
    fields = _stat(pid)
    if fields is None:
        return True                      # gone meanwhile
    return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & 0x4)    # 0x4: PF_EXITING


def _alive(pid) -> bool:
    fields = _stat(pid) if isinstance(pid, int) else None
    return fields is not None and fields[0] != b"Z"


def _stat(pid) -> list[bytes] | None:
    """/proc/PID/stat's fields after the command name (state first, flags seventh), or None
    when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return None
    return fields if len(fields) > 6 else None


def _connect(project, start) -> Conn:
    s = _try(project.socket)
    if s is None and start and lock_held(project):
        # A daemon holds the project but does not answer: starting (its socket is not bound
        # yet: it answers within a moment), or stopping (a VM's last memory snapshot being
        # written; a new one could not take the project before it ends). Wait for either.
        began = time.monotonic()
        said = False
        while s is None and lock_held(project) and time.monotonic() - began < STOPPING_WAIT_S:
            time.sleep(0.05)
            s = _try(project.socket)
            if s is None and not said and time.monotonic() - began > 1:     # not a start, then
                sys.stderr.write("envgit: the session daemon of this project is still stopping; "
                                 "waiting for it\n")
                said = True
        if s is None:
            s = _try(project.socket)
    if s is None and start:
        proc = _spawn(project)
        deadline = time.monotonic() + START_TIMEOUT_S
        while s is None and time.monotonic() < deadline:
            # a failed connect() is ~20 µs: polling often costs nothing, and a step's first
            # start waits ~1 ms for the socket instead of ~10 on average at 20 ms a poll
            time.sleep(0.002)
            s = _try(project.socket)
            if s is None and proc.poll() not in (None, 0):     # it died: say why, do not wait
                raise DaemonError(_last_words(project))
    if s is None:
        raise DaemonError(f"no session daemon answers on {project.socket}; "
                          f"see {project.state_path('daemon.log')}")
    return _greeted(Conn(s), project)


def _greeted(conn, project) -> Conn:
    """A connection the daemon has answered on. connect() succeeding says only that the
    kernel queued it: a daemon out of file descriptors, or stuck, never accepts or reads it,
    and a step would wait for ever. One `hello` round trip (~0.1 ms) with a timeout says so."""
    conn.sock.settimeout(ANSWER_TIMEOUT_S)
    try:
        reply = conn.request({"op": "hello", "protocol": PROTOCOL})
    except TimeoutError:
        conn.close()
        raise DaemonError(f"the session daemon did not answer in {ANSWER_TIMEOUT_S:g} s (too "
                          "many connections, or stuck); see "
                          f"{project.state_path('daemon.log')}, or `envgit daemon stop` and retry") from None
    except OSError as e:
        conn.close()
        raise DaemonError(f"the session daemon could not be reached: {e}") from None
    if reply.get("error") and reply.get("exit") == 3:     # full (an older daemon: "unknown op")
        conn.close()
        raise DaemonError(reply["error"].removeprefix("envgit: "))
    conn.sock.settimeout(None)
    conn.greeting = reply
    return conn


def _spawn(project):
    import subprocess  # only when the daemon has to be started

    from ..importpath import PYTHON_ARGS, SPAWN_CWD, project_entries, refusal, spawn_env, spawn_path
    # -P from "/": nothing the project holds is on the daemon's import path (importpath.py)
    if inside := project_entries(project.root, spawn_path()):
        raise DaemonError(refusal(project.root, inside))
    log = open(project.state_path("daemon.log"), "ab")
    proc = subprocess.Popen([sys.executable, *PYTHON_ARGS, "-m", "envgit.daemon", project.root],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=spawn_env(),
                            start_new_session=True, close_fds=True, cwd=SPAWN_CWD)
    log.close()
    return proc


def _last_words(project) -> str:
    """Why the daemon this client started exited: its `envgit:` line in daemon.log."""
    path = project.state_path("daemon.log")
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        lines = []
    said = [line for line in lines if line.startswith("envgit: ")]
    if said:
        return said[-1].removeprefix("envgit: ")
    try:                                # a full disk may not have let it write even that line
        full = os.statvfs(path).f_bavail == 0
    except OSError:
        full = False
    if full:
        return ("the disk holding .envgit is full: the session daemon could not start; free some "
                "space and run the command again")
    return f"the session daemon could not start; see {path}"
