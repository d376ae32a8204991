"""The sandbox's resolver: in every step's network namespace, 127.0.0.1:53 (UDP) answers every
name "does not exist" at once, and each name asked is recorded on the step.

Why: the namespace has loopback only, so without this a lookup fails with "temporary failure"
(EAI_AGAIN), which clients retry (npm waited 70 s per request), and nobody learns which host
the step wanted. With it, a lookup fails for good at once (NXDOMAIN: `ENOTFOUND`,
"Could not resolve host") and envgit can say after the step which hosts it tried and the line
of envgit.yaml that would allow them.

How, with no process inside the sandbox and no capability for the command: a child forked by
the waiting process (Planter; forked while bwrap starts) is given the sandbox's init pid
between bwrap's --info-fd (the namespaces exist) and --block-fd (the command has not started);
it joins the sandbox's user namespace (created by our uid, so we hold its capabilities) and its
network namespace (setns), binds a UDP socket to 127.0.0.1:53 there and hands it back over a
socketpair (SCM_RIGHTS). The socket stays in the sandbox's namespace; it
is read and answered outside, by `envgit run` (or the daemon, for the steps it starts). No
query is ever forwarded: the answer is made from the query alone. The sandbox's
/etc/resolv.conf (view.py) names 127.0.0.1 with one attempt of one second, so even a resolver
that is not there (a plant that failed) fails fast: the port is closed, refused at once.

Standard library only, and neither `socket` nor `select` (`envgit run` imports this).
"""

import _socket
import os
import sys

NS_GET_USERNS = 0xB701            # ioctl on a namespace fd: the user namespace that owns it
ADDRESS = ("127.0.0.1", 53)
RESOLV_CONF = ("# envgit: the sandbox's resolver. Every name is answered \"does not exist\" at once\n"
               "# and recorded on the step (envgit show); hosts are reached through envgit's proxy\n"
               "# only, for the hosts in network.allow.\n"
               "nameserver 127.0.0.1\n"
               "options attempts:1 timeout:1\n")
MAX_NAMES = 100                   # names recorded per step; the rest are counted
MAX_NAME_CHARS = 1024             # a name in presentation form (255 wire bytes, escaped \DDD)
PER_WAKE = 64                     # datagrams answered per call of serve()
PLANT_TIMEOUT_S = 10.0        # a bound on a stuck planter only: a loaded machine took over 2 s


class Planter:
    """A forked child that waits for bwrap's sandbox init pid, then joins that sandbox's user
    and network namespaces, binds 127.0.0.1:53 there and hands the socket back. Forked before
    bwrap is spawned (`envgit run`), so the fork runs beside bwrap's own start and only the
    hand-over (one wake-up each way: ~1 ms at best here, where a fork then took 1-15 ms on a
    loaded machine) is left between --info-fd and --block-fd."""

    def __init__(self):
        self.pid = self.sock = None
        if "threading" in sys.modules and not _quiet_fork:
            _quiet_fork_warning()           # the daemon forks from a worker thread (inner.py)
        try:
            # SEQPACKET: a closed end is seen (EOF) by the other, and SCM_RIGHTS passes
            ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        except OSError:
            return
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return
        if pid == 0:                                 # the child: a few syscalls, then _exit
            code = 1
            try:
                ours.close()
                child_pid = int(theirs.recv(32) or b"0")
                if child_pid > 0:
                    net = os.open(f"/proc/{child_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                    import fcntl  # builtin: cheap, and only in the child
                    os.setns(fcntl.ioctl(net, NS_GET_USERNS), os.CLONE_NEWUSER)
                    os.setns(net, os.CLONE_NEWNET)
                    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
                    s.bind(ADDRESS)
                    theirs.sendmsg([b"k"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                             s.fileno().to_bytes(4, sys.byteorder))])
                    code = 0
            except BaseException:
                pass
            finally:
                os._exit(code)
        theirs.close()
        self.pid, self.sock = pid, ours

    def plant(self, child_pid) -> int | None:
        """The bound socket (non-blocking, close-on-exec) in `child_pid`'s network namespace,
        or None (the step then runs without it: its lookups are refused at once, unrecorded)."""
        if self.sock is None:
            return None
        anc = []
        try:
            if isinstance(child_pid, int) and child_pid > 0:
                self.sock.settimeout(PLANT_TIMEOUT_S)
                self.sock.send(str(child_pid).encode())
                _, anc, _, _ = self.sock.recvmsg(1, _socket.CMSG_SPACE(4), _socket.MSG_CMSG_CLOEXEC)
        except OSError:
            pass
        finally:
            self.close()
        for level, kind, data in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS and len(data) >= 4:
                fd = int.from_bytes(data[:4], sys.byteorder)
                os.set_blocking(fd, False)
                return fd
        return None

    def close(self):
        """Let the child go (EOF) and reap it."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.pid is not None:
            try:
                os.waitpid(self.pid, 0)
            except (ChildProcessError, InterruptedError):
                pass
            self.pid = None


def plant(child_pid) -> int | None:
    """The socket for `child_pid`'s namespace: entered directly when this process may
    (can_enter), else through a planter forked now (the daemon's steps)."""
    if not isinstance(child_pid, int) or child_pid <= 0:
        return None
    if can_enter():
        fd = enter_and_bind(child_pid)
        if fd is not None:
            return fd
    return Planter().plant(child_pid)


CAP_SYS_ADMIN = 21
_can_enter: list[bool] = []


def can_enter() -> bool:
    """This process holds CAP_SYS_ADMIN (root on most hosts and in CI, not in a default
    Docker container): it may enter the sandbox's network namespace itself and come back."""
    if not _can_enter:
        eff = 0
        try:
            with open("/proc/self/status", "rb") as f:
                for line in f:
                    if line.startswith(b"CapEff:"):
                        eff = int(line.split()[1], 16)
        except (OSError, ValueError, IndexError):
            pass
        _can_enter.append(bool(eff >> CAP_SYS_ADMIN & 1))
    return _can_enter[0]


def enter_and_bind(child_pid) -> int | None:
    """Bind the socket from this thread: into the sandbox's network namespace (setns is per
    thread), socket and bind, and back. No child to wake: ~0.1 ms. None if refused."""
    try:
        here = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    there = s = None
    try:
        there = os.open(f"/proc/{child_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        os.setns(there, os.CLONE_NEWNET)
        try:
            s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
            s.bind(ADDRESS)
        finally:
            os.setns(here, os.CLONE_NEWNET)     # back before anything else happens here
        s.setblocking(False)
        return s.detach()
    except OSError:
        if s is not None:
            s.close()
        return None
    finally:
        os.close(here)
        if there is not None:
            os.close(there)


_quiet_fork: list[int] = []


def _quiet_fork_warning():
    """Python warns about fork() in a process with threads (a child could find a lock held):
    this child only makes system calls on objects it was handed, then _exits."""
    import warnings
    warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded, use of fork",
                            category=DeprecationWarning)
    _quiet_fork.append(1)


class Resolver:
    """The answering side of one step's planted socket: serve() when it is readable; names
    and counts in summary() for the step's end."""

    def __init__(self):
        self.sock = self.planter = None
        self.names: dict[str, None] = {}     # ordered set, first asked first
        self.queries = 0                      # every query answered
        self.unlisted = 0                     # queries for names past MAX_NAMES

    def prepare(self):
        """Fork the planter now, before the sandbox is spawned (off the step's critical path),
        unless this process can enter the sandbox's namespace itself."""
        if not can_enter():
            self.planter = Planter()

    def plant(self, child_pid):
        """Plant the socket in the sandbox of `child_pid` (after bwrap's --info-fd)."""
        planter, self.planter = self.planter, None
        fd = planter.plant(child_pid) if planter is not None else plant(child_pid)
        if fd is not None:
            self.sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM, 0, fd)
        return self.sock is not None

    def fileno(self):
        return self.sock.fileno() if self.sock is not None else None

    def serve(self) -> int:
        """Answer what is queued, at most PER_WAKE datagrams (a flood cannot hold the caller);
        the number read."""
        n = 0
        while self.sock is not None and n < PER_WAKE:
            try:
                data, peer = self.sock.recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            n += 1
            reply, name = answer(data)
            if name is not None:
                self.queries += 1
                if name in self.names:
                    pass
                elif len(self.names) < MAX_NAMES:
                    self.names[name] = None
                else:
                    self.unlisted += 1
            if reply is not None:
                try:
                    self.sock.sendto(reply, peer)
                except OSError:
                    pass                      # the asker is gone, or its buffer is full
        return n

    def summary(self) -> dict | None:
        """{"names", "queries", "unlisted"} for the step's end, or None if nothing was asked."""
        if not self.queries:
            return None
        return {"names": list(self.names), "queries": self.queries, "unlisted": self.unlisted}

    def close(self):
        if self.planter is not None:             # never planted (bwrap did not start)
            self.planter.close()
            self.planter = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None


NOERROR, FORMERR, NXDOMAIN, NOTIMP = 0, 1, 3, 4


def answer(query: bytes) -> tuple[bytes | None, str | None]:
    """(the reply to send, the name asked) for one datagram. Every well-formed query gets
    NXDOMAIN with its question echoed; a malformed one FORMERR (a header is needed to answer
    at all); another opcode NOTIMP; a response (QR set) nothing, so two resolvers cannot be
    made to answer each other. Nothing is looked up anywhere."""
    if len(query) < 12 or query[2] & 0x80:
        return None, None
    opcode = (query[2] >> 3) & 0x0F
    if opcode != 0:
        return _reply(query, NOTIMP), None
    if int.from_bytes(query[4:6], "big") != 1:
        return _reply(query, FORMERR), None
    labels, i, wire = [], 12, 1
    while True:
        if i >= len(query):
            return _reply(query, FORMERR), None
        n = query[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0 or i + 1 + n > len(query):     # no compression in a question we answer
            return _reply(query, FORMERR), None
        wire += n + 1
        if wire > 255:
            return _reply(query, FORMERR), None
        labels.append(query[i + 1:i + 1 + n])
        i += 1 + n
    if i + 4 > len(query):
        return _reply(query, FORMERR), None
    name = ".".join(_label(b) for b in labels) or "."
    return _reply(query, NXDOMAIN, query[12:i + 4]), name[:MAX_NAME_CHARS]


def _reply(query, rcode, question=b""):
    flags = bytes([0x80 | (query[2] & 0x79), 0x80 | rcode])   # QR, opcode and RD kept; RA
    counts = (b"\x00\x01" if question else b"\x00\x00") + b"\x00\x00" * 3
    return query[:2] + flags + counts + question


def _label(raw: bytes) -> str:
    """A label in the DNS presentation form (RFC 1035 §5.1), lower case: letters, digits and
    other printable ASCII as they are, '.' and '\\' escaped, any other byte as \\DDD. The
    name a step chose is then inert text whatever its bytes (no terminal escape survives)."""
    out = []
    for c in raw:
        if c in (0x2E, 0x5C):
            out.append("\\" + chr(c))
        elif 0x21 <= c <= 0x7E:
            out.append(chr(c).lower())
        else:
            out.append(f"\\{c:03d}")
    return "".join(out)
