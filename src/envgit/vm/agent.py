"""The guest agent: pid 1 of the VM tier's guest (started by the initramfs's /init), speaking
wire.py's frames on the virtio-serial port `envgit.agent`.

It runs each step's command with the caller's streams (a pty when the caller has a terminal,
pipes otherwise) and returns its wait status; what a step starts in the background keeps
running after it (its output is read and dropped once the step has ended, so it never blocks
on a full pipe, and its terminal is never hung up). It keeps the guest's copy of the project
(in the guest's RAM, so a memory snapshot holds it with the processes) in step with the host's:
PUT frames write the host's changes in, COLLECT sends back what the guest changed.

Runs under the guest's Python 3.11: standard library only, no envgit imports but wire.py
(copied beside it into the guest).
"""

import fcntl
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import termios
import time

try:
    from . import wire  # on the host (tests, sync.py)
except ImportError:
    import wire  # type: ignore[import-not-found, no-redef]  # in the guest: /envgit/wire.py beside it


class Step:
    def __init__(self, channel):
        self.channel = channel
        self.pid = None          # whose status is the step's
        self.stdin = None
        self.outs = {}           # fd -> frame kind
        self.status_pipe = None  # tty mode: the session holder writes the command's status here
        self.status = None
        self.tty = False
        self.pgid = None


class Agent:
    def __init__(self, port_fd, root):
        self.port = port_fd
        self.root = root
        self.reader = wire.Reader()
        self.steps: dict[int, Step] = {}
        self.orphans = set()     # output fds of ended steps: read and dropped
        self.manifest = {}       # rel path -> (kind, size, mtime_ns, mode): as last synced
        # The guest's only way out: 127.0.0.1:3128, each connection a channel on this port to
        # the host's gate (the same gate and proxy credentials as the default tier's steps).
        self.proxy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.proxy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.proxy.bind(("127.0.0.1", 3128))
        self.proxy.listen(64)
        self.proxy.setblocking(False)
        self.net = {}            # channel -> socket
        self.net_of = {}         # fd -> channel
        self.net_ids = wire.NET_BASE
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def send(self, kind, payload=b"", channel=0):
        wire.write_all(self.port, wire.pack(kind, payload, channel))

    # --- the loop ---------------------------------------------------------------------------

    def serve(self):
        while True:
            try:
                self.once()
            except Exception as e:      # pid 1 never ends: its end is the guest's panic
                try:
                    os.write(2, f"envgit agent: {type(e).__name__}: {e}\n".encode())
                    self._drop_bad_fds()
                except Exception:
                    pass

    def _drop_bad_fds(self):
        for fd in list(self.orphans):
            try:
                os.fstat(fd)
            except OSError:
                self.orphans.discard(fd)
        for st in self.steps.values():
            for fd in list(st.outs):
                try:
                    os.fstat(fd)
                except OSError:
                    del st.outs[fd]

    def once(self):
        fds = [self.port, self.wake_r, self.proxy.fileno()] + list(self.orphans) + list(self.net_of)
        for st in self.steps.values():
            fds += list(st.outs)
            if st.status_pipe is not None:
                fds.append(st.status_pipe)
        try:
            ready, _, _ = select.select(fds, [], [], 5.0)
        except InterruptedError:
            return
        for fd in ready:
            if fd == self.port:
                try:
                    data = os.read(self.port, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:           # the host end is not connected: wait for it
                    select.select([], [], [], 0.01)     # a restore reconnects within ms
                    continue
                self.reader.feed(data)
                for kind, channel, payload in self.reader.frames():
                    self.handle(kind, channel, payload)
            elif fd == self.wake_r:
                try:
                    os.read(self.wake_r, 512)
                except BlockingIOError:
                    pass
            elif fd == self.proxy.fileno():
                self._net_accept()
            elif fd in self.net_of:
                self._net_read(fd)
            elif fd in self.orphans:
                self._drop_output(fd)
            else:
                for st in list(self.steps.values()):
                    if fd in st.outs:
                        self._output(st, fd)
                    elif fd == st.status_pipe:
                        self._status_from_pipe(st)
        self.reap()
        self.finish_steps()

    def _net_accept(self):
        try:
            conn, _ = self.proxy.accept()
        except (BlockingIOError, InterruptedError):
            return
        self.net_ids += 1
        ch = self.net_ids
        self.net[ch] = conn
        self.net_of[conn.fileno()] = ch
        self.send(wire.NET_OPEN, b"", ch)

    def _net_read(self, fd):
        ch = self.net_of[fd]
        try:
            data = self.net[ch].recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self.send(wire.NET_DATA, data, ch)
        else:
            self.send(wire.NET_CLOSE, b"", ch)
            self._net_drop(ch)

    def _net_drop(self, ch):
        conn = self.net.pop(ch, None)
        if conn is not None:
            self.net_of.pop(conn.fileno(), None)
            conn.close()

    def _drop_output(self, fd):
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.orphans.discard(fd)
            os.close(fd)

    def _output(self, st, fd):
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:                 # EIO: a pty whose last slave is closed
            data = b""
        if data:
            self.send(st.outs[fd], data, st.channel)
        else:
            del st.outs[fd]
            os.close(fd)

    def _status_from_pipe(self, st):
        data = os.read(st.status_pipe, 8)
        os.close(st.status_pipe)
        st.status_pipe = None
        if len(data) >= 4:
            st.status = struct.unpack("!i", data[:4])[0]

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for st in self.steps.values():
                if st.pid == pid and st.status_pipe is None and st.status is None:
                    st.status = status

    def finish_steps(self):
        for channel, st in list(self.steps.items()):
            if st.status is None:
                continue
            for fd in list(st.outs):        # what the command wrote before it ended
                while fd in st.outs:
                    try:
                        data = os.read(fd, 1 << 16)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        data = b""
                    if not data:
                        del st.outs[fd]
                        os.close(fd)
                        break
                    self.send(st.outs[fd], data, channel)
            self.orphans.update(st.outs)    # a background process of the step still holds them
            if st.stdin is not None and not st.tty:     # a pty's master is its output too:
                os.close(st.stdin)                      # closed with the output, once
            status = st.status
            if os.WIFSIGNALED(status):
                code, sig = 128 + os.WTERMSIG(status), os.WTERMSIG(status)
            else:
                code, sig = os.WEXITSTATUS(status), 0
            self.send(wire.EXIT, wire.exit_payload(code, sig), channel)
            del self.steps[channel]

    # --- requests ---------------------------------------------------------------------------

    def handle(self, kind, channel, payload):
        try:
            if kind == wire.RUN:
                self.run(channel, json.loads(payload))
            elif kind == wire.STDIN:
                st = self.steps.get(channel)
                if st is not None and st.stdin is not None:
                    try:
                        wire.write_all(st.stdin, payload)
                    except OSError:
                        pass
            elif kind == wire.STDIN_EOF:
                st = self.steps.get(channel)
                if st is not None and st.stdin is not None and not st.tty:
                    os.close(st.stdin)
                    st.stdin = None
            elif kind == wire.SIGNAL:
                st = self.steps.get(channel)
                if st is not None and st.pid:
                    try:           # on a pty: whatever group holds its foreground (the command's)
                        pgid = os.tcgetpgrp(st.stdin) if st.tty else st.pgid
                        os.killpg(pgid, struct.unpack("!I", payload)[0])
                    except OSError:
                        pass
            elif kind == wire.WINSIZE:
                st = self.steps.get(channel)
                if st is not None and st.tty:
                    fcntl.ioctl(st.stdin, termios.TIOCSWINSZ, struct.pack("HHHH", *struct.unpack("!HH", payload), 0, 0))
            elif kind == wire.PUT:
                self.put(payload)
            elif kind == wire.COLLECT:
                self.collect(channel)
            elif kind == wire.SYNCED:
                self.send(wire.DONE, b"", channel)
            elif kind == wire.PING:
                self.send(wire.DONE, payload, channel)
            elif kind == wire.SETUP:
                self.setup(json.loads(payload))
                self.send(wire.DONE, b"", channel)
            elif kind == wire.NET_DATA:
                conn = self.net.get(channel)
                if conn is not None:
                    try:
                        conn.sendall(payload)
                    except OSError:
                        self._net_drop(channel)
            elif kind == wire.NET_CLOSE:
                conn = self.net.get(channel)
                if conn is not None:
                    try:
                        conn.shutdown(socket.SHUT_WR)
                    except OSError:
                        self._net_drop(channel)
        except Exception as e:          # one bad request never ends the agent (it is pid 1)
            self.send(wire.ERROR, f"{type(e).__name__}: {e}".encode(), channel)

    def run(self, channel, req):
        st = Step(channel)
        st.tty = bool(req.get("tty"))
        argv, env = req["argv"], req.get("env") or {}
        cwd = req.get("cwd") or self.root or "/"
        if st.tty:
            master, slave = os.openpty()
            rows, cols = req.get("rows") or 24, req.get("cols") or 80
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            status_r, status_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                _holder(slave, status_w, argv, env, cwd, (master, status_r, self.port))
            os.close(slave)
            os.close(status_w)
            os.set_blocking(master, False)
            st.pid, st.pgid, st.stdin, st.status_pipe = pid, pid, master, status_r
            st.outs = {master: wire.STDOUT}
        else:
            in_r, in_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.setsid()
                for i, fd in enumerate((in_r, out_w, err_w)):
                    os.dup2(fd, i)
                _exec(argv, env, cwd)
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            for fd in (out_r, err_r):
                os.set_blocking(fd, False)
            st.pid, st.pgid, st.stdin = pid, pid, in_w
            st.outs = {out_r: wire.STDOUT, err_r: wire.STDERR}
        self.steps[channel] = st

    def setup(self, h):
        """What must be this machine's own, told by the host after every boot and restore: a
        guest restored from a kept booted snapshot (qemu.py, kept.py) shares its RAM with every
        other guest restored from it, so its kernel's random generator is reseeded from the
        host's bytes (else two guests draw the same "random" numbers), its clock set to the
        host's (else it reads the time the snapshot was taken), and it learns its project."""
        if h.get("root"):
            self.root = h["root"]
            os.makedirs(self.root, exist_ok=True)
        if h.get("time_ns"):
            time.clock_settime_ns(time.CLOCK_REALTIME, int(h["time_ns"]))
        if h.get("seed"):
            _reseed(bytes.fromhex(h["seed"]))

    # --- the project's copy -----------------------------------------------------------------

    def _path(self, rel):
        if not self.root:
            raise ValueError("no project yet (the host's SETUP names it)")
        if rel.startswith("/") or ".." in rel.split("/"):
            raise ValueError(f"bad path {rel!r}")
        return os.path.join(self.root, rel)

    def put(self, payload):
        head, _, data = payload.partition(b"\n")
        h = json.loads(head)
        rel, op = h["path"], h["op"]
        if op == "ca":                  # the gate's CA bundle, for TLS through the gate
            os.makedirs("/etc/ssl/certs", exist_ok=True)
            with open("/etc/ssl/certs/ca-certificates.crt", "wb") as f:
                f.write(data)
            return
        p = self._path(rel)
        if op == "rm":
            _remove(p)
            for k in [k for k in self.manifest if k == rel or k.startswith(rel + "/")]:
                del self.manifest[k]
            return
        parent = os.path.dirname(p)
        if not os.path.isdir(parent):
            os.makedirs(parent, exist_ok=True)
        if op == "dir":
            if not os.path.isdir(p) or os.path.islink(p):
                _remove(p)
                os.mkdir(p)
            os.chmod(p, h["mode"])
        elif op == "link":
            _remove(p)
            os.symlink(h["target"], p)
        elif op == "file":
            if h.get("offset", 0) == 0:
                if os.path.isdir(p) and not os.path.islink(p):
                    _remove(p)
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            else:
                fd = os.open(p, os.O_WRONLY | os.O_NOFOLLOW)
            try:                        # at its offset: a gap stays a hole in the guest's RAM
                wire.write_piece(fd, h.get("offset", 0), data, h.get("size") if h.get("last", True) else None)
            finally:
                os.close(fd)
            os.chmod(p, h["mode"])
        if h.get("last", True):
            self.manifest[rel] = _entry(os.lstat(p))

    def collect(self, channel):
        """Send what changed in the guest's copy since the last sync, then take it as synced."""
        now = {}
        _walk(self.root, "", now)
        for rel in sorted(set(self.manifest) - set(now), reverse=True):
            self.send(wire.CHANGE, json.dumps({"path": rel, "op": "rm"}).encode() + b"\n", channel)
        for rel in sorted(now):
            e = now[rel]
            if self.manifest.get(rel) == e:
                continue
            p = os.path.join(self.root, rel)
            h = {"path": rel, "mode": e[3]}
            if e[0] == "dir":
                self.send(wire.CHANGE, json.dumps({**h, "op": "dir"}).encode() + b"\n", channel)
            elif e[0] == "link":
                link = {**h, "op": "link", "target": os.readlink(p)}
                self.send(wire.CHANGE, json.dumps(link).encode() + b"\n", channel)
            else:
                try:
                    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    # not readable now (a step's chmod 000: the guest's root has no DAC
                    # override): not taken as synced, so the next collect tries it again
                    if rel in self.manifest:
                        now[rel] = self.manifest[rel]
                    else:
                        del now[rel]
                    continue
                try:
                    for off, data, last, size in wire.file_pieces(fd):      # sparse: data only
                        self.send(wire.CHANGE, json.dumps({**h, "op": "file", "offset": off, "last": last,
                                                           "size": size}).encode() + b"\n" + data, channel)
                finally:
                    os.close(fd)
        self.manifest = now
        self.send(wire.DONE, b"", channel)


RNDADDENTROPY = 0x40085203     # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207         # _IO('R', 0x07)


def _reseed(seed: bytes):
    """`seed` into the kernel's input pool (credited), then a reseed of its generator now,
    not at its next interval: every later read of /dev/urandom or getrandom() depends on it."""
    fd = os.open("/dev/urandom", os.O_WRONLY)
    try:
        fcntl.ioctl(fd, RNDADDENTROPY, struct.pack("ii", len(seed) * 8, len(seed)) + seed)
        fcntl.ioctl(fd, RNDRESEEDCRNG)
    finally:
        os.close(fd)


def _entry(st):
    if stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISLNK(st.st_mode):
        kind = "link"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        return None
    return (kind, st.st_size if kind == "file" else 0, st.st_mtime_ns if kind != "dir" else 0,
            stat.S_IMODE(st.st_mode))


def _walk(top, rel, out):
    try:
        names = os.listdir(os.path.join(top, rel) if rel else top)
    except OSError:
        return
    for name in names:
        r = f"{rel}/{name}" if rel else name
        try:
            e = _entry(os.lstat(os.path.join(top, r)))
        except OSError:
            continue
        if e is None:
            continue
        out[r] = e
        if e[0] == "dir":
            _walk(top, r, out)


def _remove(p):
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        for name in os.listdir(p):
            _remove(os.path.join(p, name))
        os.rmdir(p)
    else:
        os.unlink(p)


# What a step's command may never have, though it runs as root in the guest: dropped from the
# bounding set before exec, so neither it nor any setuid or file-capability program it runs
# gets them back. Without CAP_SYS_PTRACE, and with a permitted set no longer a superset of pid
# 1's, the kernel's ptrace access check denies every step process pid 1: no `pidfd_getfd` of
# the agent's port (which would let a step's child eat the host's requests or forge a step's
# EXIT), no /proc/1/mem or /proc/1/fd. The others reach the kernel or pid 1's memory by other
# doors (modules, /dev/mem, BPF and perf probes, kexec, CAP_SYS_ADMIN's many).
STEP_CAPS_DROPPED = {
    "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21,
    "CAP_SYS_BOOT": 22, "CAP_MAC_OVERRIDE": 32, "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34,
    "CAP_PERFMON": 38, "CAP_BPF": 39,
}
PR_CAPBSET_DROP = 24


def _drop_capabilities():
    """In a step's process, before exec: STEP_CAPS_DROPPED out of its bounding set. Fails
    closed: a step whose capabilities could not be dropped does not run."""
    import ctypes
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 40
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    for name, cap in STEP_CAPS_DROPPED.items():
        if cap <= last and prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"could not drop {name}")


def _exec(argv, env, cwd):
    try:
        _drop_capabilities()
        signal.set_wakeup_fd(-1)
        for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGQUIT, signal.SIGTTOU, signal.SIGPIPE):
            signal.signal(s, signal.SIG_DFL)
        try:
            os.chdir(cwd)
        except OSError:
            os.chdir("/")
        os.closerange(3, 1 << 16)
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        os.write(2, f"envgit: {argv[0]}: command not found\n".encode())
        os._exit(127)
    except OSError as e:
        os.write(2, f"envgit: {argv[0]}: {e.strerror}\n".encode())
        os._exit(126)
    except BaseException as e:          # a forked child never returns into pid 1's loop
        os.write(2, f"envgit: {argv[0]}: {type(e).__name__}: {e}\n".encode())
        os._exit(126)
    os._exit(126)


def _holder(slave, status_w, argv, env, cwd, close):
    """A tty step's session leader: the terminal's controlling process, holding it while the
    command (its own process group, in the foreground) runs; then it takes the foreground back
    before it exits, so the hang-up its exit sends reaches no process the step left running."""
    try:
        for fd in close:
            os.close(fd)
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            os.tcsetpgrp(slave, os.getpid())
            os.close(status_w)
            for i in range(3):
                os.dup2(slave, i)
            _exec(argv, env, cwd)
        os.setpgid(pid, pid) if os.getpgid(pid) != pid else None
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        os.tcsetpgrp(slave, os.getpgrp())
        os.write(status_w, struct.pack("!i", status))
    finally:
        os._exit(0)


def main():
    # the project's path, as on the host: none on the kernel's command line any more (a
    # booted guest is kept for every project), told by the host's SETUP
    root = bytes.fromhex(sys.argv[1]).decode() if len(sys.argv) > 2 and sys.argv[1] else None
    port = sys.argv[-1]
    if root:
        os.makedirs(root, exist_ok=True)
    fd = os.open(port, os.O_RDWR)
    Agent(fd, root).serve()


if __name__ == "__main__":
    main()
