"""The metadata calls Landlock has no right for (chmod, chown, utimensat, setxattr and their
kin), judged for a Landlock step by its launcher: without this a step could change the mode,
times or extended attributes of any file its uid owns anywhere (as root, of every root-owned
file of the host: /etc/shadow 0644). Each such call of the step stops in the kernel and comes
here (seccomp's user notification); the launcher, outside the step's domain, opens what the call
names exactly as the step would have reached it (from its cwd or its directory fd, following
links or not as the call says) as an O_PATH descriptor, and acts on that descriptor only if the
file it holds is inside a writable place of the step's (the project, its tmp, its caches, an
allow_write): the inode checked is the inode changed, whatever the step renames or relinks
meanwhile. Anything else gets EPERM, as a read-only file system would answer.

What is done for the step is what it could do itself: a mode (never a setuid or setgid bit),
times, a `user.` attribute or an ACL of a file its uid owns; a chown that changes nothing. x86-64
only (the numbers below); elsewhere these calls stay as Landlock leaves them (backend.WEAKER).
Standard library only.
"""

import ctypes
import errno
import os
import select
import stat
import struct
import threading

# imported now: the step's process builds the filter after its Landlock rules apply, when the
# interpreter's own files are no longer readable to it
from .seccomp import _ALLOW, _ERRNO, _LD_W_ABS, _NR, _RET_K, _op, returning

# x86-64 numbers -> (what, where the path is: ("path", i) | ("at", dirfd i, path i) | ("fd", i),
#                    follow links (True/False, or ("flags", i): AT_SYMLINK_NOFOLLOW in arg i))
CALLS = {
    90: ("chmod", ("path", 0), True), 91: ("chmod", ("fd", 0), True),
    268: ("chmod", ("at", 0, 1), True), 452: ("chmod", ("at", 0, 1), ("flags", 3)),
    92: ("chown", ("path", 0), True), 93: ("chown", ("fd", 0), True), 94: ("chown", ("path", 0), False),
    260: ("chown", ("at", 0, 1), ("flags", 4)),
    280: ("utimens", ("at", 0, 1), ("flags", 3)),
    188: ("setxattr", ("path", 0), True), 189: ("setxattr", ("path", 0), False),
    190: ("setxattr", ("fd", 0), True),
    197: ("removexattr", ("path", 0), True), 198: ("removexattr", ("path", 0), False),
    199: ("removexattr", ("fd", 0), True),
}
# the old forms and the newest ones, which libc does not need: absent (ENOSYS)
ABSENT = (132, 235, 261, 463, 466, 469)      # utime, utimes, futimesat, setxattrat, removexattrat, file_setattr
AT_FDCWD, AT_SYMLINK_NOFOLLOW, AT_EMPTY_PATH = -100, 0x100, 0x1000

SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER = 1, 1 << 3
SECCOMP_RET_USER_NOTIF = 0x7FC00000
NOTIF_RECV, NOTIF_SEND, NOTIF_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
SECCOMP_NR, PIDFD_OPEN, PIDFD_GETFD = 317, 434, 438

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def supported() -> bool:
    return os.uname().machine == "x86_64"


def program() -> bytes:
    """The filter sending CALLS to the listener, ABSENT refused as missing, the rest allowed."""
    return b"".join([_op(_LD_W_ABS, _NR), *returning(CALLS, SECCOMP_RET_USER_NOTIF),
                     *returning(ABSENT, _ERRNO | errno.ENOSYS), _op(_RET_K, _ALLOW)])


def sock_fprog(prog: bytes):
    """The kernel's `struct sock_fprog` for a filter `prog`, as a buffer to pass by address
    (prctl's PR_SET_SECCOMP, seccomp(2)); it keeps `prog`'s own buffer alive with it."""
    filt = ctypes.create_string_buffer(prog, len(prog))
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(prog) // 8, ctypes.addressof(filt)), 16)
    fprog.keep = filt       # type: ignore[attr-defined]
    return fprog


def install() -> int:
    """In the step's process, after no_new_privs: the filter, and the listener's fd."""
    fd = _libc.syscall(ctypes.c_long(SECCOMP_NR), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
                       ctypes.c_long(SECCOMP_FILTER_FLAG_NEW_LISTENER), sock_fprog(program()))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "seccomp listener: " + os.strerror(ctypes.get_errno()))
    return fd


def take_listener(pid, fd_number) -> int:
    """The listener fd of child `pid` (its number `fd_number` there), duplicated here."""
    pidfd = _libc.syscall(ctypes.c_long(PIDFD_OPEN), ctypes.c_long(pid), ctypes.c_long(0))
    if pidfd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_open")
    try:
        fd = _libc.syscall(ctypes.c_long(PIDFD_GETFD), ctypes.c_long(pidfd), ctypes.c_long(fd_number),
                           ctypes.c_long(0))
        if fd < 0:
            raise OSError(ctypes.get_errno(), "pidfd_getfd")
        return fd
    finally:
        os.close(pidfd)


class Supervisor(threading.Thread):
    """Answers the step's metadata calls until the last process of it is gone."""

    def __init__(self, listener: int, writable: list[str]):
        super().__init__(daemon=True)
        self.fd = listener
        self.writable = [os.path.realpath(w) for w in writable]

    def run(self):
        try:
            self._serve()
        finally:                # closed, the step's next such call fails (ENOSYS) instead of hanging
            os.close(self.fd)

    def _serve(self):
        poll = select.poll()
        poll.register(self.fd, select.POLLIN)
        req = ctypes.create_string_buffer(80)
        while True:
            try:
                events = poll.poll(1000)
            except InterruptedError:
                continue
            if any(ev & (select.POLLHUP | select.POLLERR) for _, ev in events):
                return
            if not events:
                continue
            ctypes.memset(req, 0, 80)
            if _libc.ioctl(self.fd, ctypes.c_ulong(NOTIF_RECV), req) != 0:
                if ctypes.get_errno() in (errno.EINTR, errno.ENOENT):
                    continue
                return
            nid, pid, _flags, nr, _arch, _ip = struct.unpack_from("=QIIIIQ", req.raw)
            args = struct.unpack_from("=6Q", req.raw, 32)
            try:
                err = self.answer(nid, pid, nr, args)
            except OSError as e:
                err = e.errno or errno.EPERM
            except Exception:           # noqa: BLE001 — never leave the step's call hanging
                err = errno.EPERM
            resp = struct.pack("=QqiI", nid, 0, -err if err else 0, 0)
            _libc.ioctl(self.fd, ctypes.c_ulong(NOTIF_SEND), ctypes.create_string_buffer(resp, len(resp)))

    # --- one call ---------------------------------------------------------------------------

    def answer(self, nid, pid, nr, args) -> int:
        """0 when done for the step, else the errno it gets."""
        what, where, follow = CALLS[nr]
        flags = _s32(args[follow[1]]) if isinstance(follow, tuple) else 0
        follow = not (flags & AT_SYMLINK_NOFOLLOW) if isinstance(follow, tuple) else follow
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            path = None
            if where[0] == "path" or (where[0] == "at" and args[where[2]]):
                path = _string(mem, args[where[1] if where[0] == "path" else where[2]])
                if path == "" and not (where[0] == "at" and flags & AT_EMPTY_PATH):
                    return errno.ENOENT
            extra = self._arguments(mem, what, nr, args)
            if not self._valid(nid):
                return errno.ENOENT
            target = self._open(pid, where, args, path, follow)
        finally:
            os.close(mem)
        try:
            return self._do(what, target, extra)
        finally:
            os.close(target)

    def _arguments(self, mem, what, nr, args):
        if what == "chmod":
            return args[1] if nr in (90, 91) else args[2]
        if what == "chown":
            return (args[1], args[2]) if nr in (92, 93, 94) else (args[2], args[3])
        if what == "utimens":
            return os.pread(mem, 32, args[2]) if args[2] else None
        if what in ("setxattr", "removexattr"):
            name = _string(mem, args[1], 256)
            if what == "removexattr":
                return (name,)
            size = args[3]
            if size > 65536:
                raise OSError(errno.E2BIG, "")
            return name, (os.pread(mem, size, args[2]) if size else b""), _s32(args[4])
        return None

    def _valid(self, nid) -> bool:
        v = ctypes.c_uint64(nid)
        return _libc.ioctl(self.fd, ctypes.c_ulong(NOTIF_ID_VALID), ctypes.byref(v)) == 0

    def _open(self, pid, where, args, path, follow) -> int:
        """An O_PATH fd on what the call names, reached as the step would reach it."""
        nofollow = 0 if follow else os.O_NOFOLLOW
        if where[0] == "fd":
            fd = _s32(args[where[1]])
            if _opened_as_path(pid, fd):
                raise OSError(errno.EBADF, "")      # fchmod of an O_PATH fd: the kernel's answer
            return os.open(f"/proc/{pid}/fd/{fd}", os.O_PATH | os.O_CLOEXEC)
        path = _as_seen_by(pid, path)
        dirfd = AT_FDCWD if where[0] == "path" else _s32(args[where[1]])
        if path is None and dirfd == AT_FDCWD:
            raise OSError(errno.EFAULT, "")         # utimensat(AT_FDCWD, NULL): no file named
        base = os.open(f"/proc/{pid}/cwd" if dirfd == AT_FDCWD else f"/proc/{pid}/fd/{dirfd}",
                       os.O_PATH | os.O_CLOEXEC)
        try:
            if not path:
                return os.dup(base)          # AT_EMPTY_PATH, or utimensat's NULL: the fd itself
            return os.open(path, os.O_PATH | os.O_CLOEXEC | nofollow, dir_fd=base)
        finally:
            os.close(base)

    def _do(self, what, t, extra) -> int:
        st = os.fstat(t)                            # an O_PATH fd: the link itself when not followed
        where = os.readlink(f"/proc/self/fd/{t}")
        if not any(where == w or where.startswith(w.rstrip("/") + "/") for w in self.writable):
            return errno.EPERM                      # outside every writable place
        if st.st_uid != os.geteuid():
            return errno.EPERM                      # the step's uid does not own it
        if stat.S_ISLNK(st.st_mode) and what != "chown":
            return errno.EOPNOTSUPP
        me = f"/proc/self/fd/{t}"
        if what == "chmod":
            mode = extra & 0o7777
            if mode & 0o6000:
                return errno.EPERM
            os.chmod(me, mode)
        elif what == "chown":
            uid, gid = (_s32(x) for x in extra)
            if uid not in (-1, st.st_uid) or gid not in (-1, st.st_gid):
                return errno.EPERM
        elif what == "utimens":
            times = None if extra is None else ctypes.create_string_buffer(extra, 32)
            if _libc.utimensat(AT_FDCWD, me.encode(), times, 0) != 0:
                return ctypes.get_errno()
        elif what == "setxattr":
            name, value, flags = extra
            if not _settable(name):
                return errno.EPERM
            os.setxattr(me, name, value, flags)
        elif what == "removexattr":
            if not _settable(extra[0]):
                return errno.EPERM
            os.removexattr(me, extra[0])
        return 0


# The names by which a process means itself, which here would mean this launcher: tar's
# `chmod("/proc/self/fd/3")` of a directory it holds open, a shell's /dev/stdin.
_SELF = (("/proc/self/", "/proc/{pid}/"), ("/proc/thread-self/", "/proc/{pid}/"),
         ("/dev/fd/", "/proc/{pid}/fd/"), ("/dev/stdin", "/proc/{pid}/fd/0"),
         ("/dev/stdout", "/proc/{pid}/fd/1"), ("/dev/stderr", "/proc/{pid}/fd/2"))


def _as_seen_by(pid, path):
    """`path` as the step's process `pid` would resolve its own-self names. (Whatever it names,
    the file reached is judged where it is, so a name that still means this launcher's own
    fds reaches nothing the step may change.)"""
    if path:
        for mine, theirs in _SELF:
            if path == mine.rstrip("/") or path.startswith(mine):
                return theirs.format(pid=pid) + path[len(mine):]
    return path


def _opened_as_path(pid, fd) -> bool:
    """The step's fd `fd` is an O_PATH one (its fdinfo's flags)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("flags:"):
                    return bool(int(line.split()[1], 8) & os.O_PATH)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _settable(name) -> bool:
    """A `user.` attribute or a POSIX ACL (what `cp -p` and `tar` keep), which the file's owner
    may set; never `security.` (file capabilities) or `trusted.`, which need privileges."""
    return name.startswith("user.") or name in ("system.posix_acl_access", "system.posix_acl_default")


def _s32(v) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _string(mem, addr, limit=4096) -> str:
    """A NUL-terminated string of the step's memory, read page by page."""
    out = b""
    while len(out) < limit:
        n = min(4096 - (addr + len(out)) % 4096, limit - len(out))
        chunk = os.pread(mem, n, addr + len(out))
        if not chunk:
            break
        end = chunk.find(b"\0")
        if end >= 0:
            return (out + chunk[:end]).decode("utf-8", "surrogateescape")
        out += chunk
    raise OSError(errno.ENAMETOOLONG, "")
