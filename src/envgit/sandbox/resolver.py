"""The sandbox's resolver: in every step's network namespace, 127.0.0.1:53 (UDP) answers every
name "does not exist" at once, and each name asked is recorded on the step.

Why: the namespace has loopback only, so without this a lookup fails with "temporary failure"
(EAI_AGAIN), which clients retry (npm waited 70 s per request), and nobody learns which host
the step wanted. With it, a lookup fails for good at once (NXDOMAIN: `ENOTFOUND`,
"Could not resolve host") and envgit can say after the step which hosts it tried and the line
of envgit.yaml that would allow them.

How, with no process inside the sandbox and no capability for the command: between bwrap's
--info-fd (the namespaces exist) and --block-fd (the command has not started), the waiting
process forks a child that joins the sandbox's user namespace (owned by our uid, so we hold
its capabilities) and network namespace (setns), binds a UDP socket to 127.0.0.1:53 there and
hands it back over a socketpair (SCM_RIGHTS). The socket stays in the sandbox's namespace; it
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
PLANT_TIMEOUT_S = 2.0


def plant(child_pid) -> int | None:
    """A UDP socket bound to 127.0.0.1:53 in the network namespace of `child_pid` (bwrap's
    sandbox init), non-blocking and close-on-exec; None if that cannot be done (the step then
    runs without it: its lookups are refused at once, and not recorded)."""
    if not isinstance(child_pid, int) or child_pid <= 0:
        return None
    if "threading" in sys.modules and not _quiet_fork:
        _quiet_fork_warning()           # the daemon forks from a worker thread (inner.py)
    try:
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        pid = os.fork()
        if pid == 0:                               # the child: a few syscalls, then _exit
            code = 1
            try:
                ours.close()
                net = os.open(f"/proc/{child_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                import fcntl                      # builtin; imported here, not before the fork
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
        try:
            ours.settimeout(PLANT_TIMEOUT_S)
            _, anc, _, _ = ours.recvmsg(1, _socket.CMSG_SPACE(4), _socket.MSG_CMSG_CLOEXEC)
        except OSError:
            anc = []
        finally:
            _reap(pid)
        for level, kind, data in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS and len(data) >= 4:
                fd = int.from_bytes(data[:4], sys.byteorder)
                os.set_blocking(fd, False)
                return fd
        return None
    except OSError:
        return None
    finally:
        ours.close()


_quiet_fork = []


def _quiet_fork_warning():
    """Python warns about fork() in a process with threads (a child could find a lock held):
    this child only makes system calls on objects it was handed, then _exits."""
    import warnings
    warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded, use of fork",
                            category=DeprecationWarning)
    _quiet_fork.append(1)


def _reap(pid):
    try:
        os.waitpid(pid, 0)
    except (ChildProcessError, InterruptedError):
        pass


class Resolver:
    """The answering side of one step's planted socket: serve() when it is readable; names
    and counts in summary() for the step's end."""

    def __init__(self):
        self.sock = None
        self.names: dict[str, None] = {}     # ordered set, first asked first
        self.queries = 0                      # every query answered
        self.unlisted = 0                     # queries for names past MAX_NAMES

    def plant(self, child_pid):
        fd = plant(child_pid)
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
