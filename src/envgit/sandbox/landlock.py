"""Landlock, the kernel's unprivileged access control (Linux 5.13+), through its three system
calls: the filesystem, TCP and scope rules of a step on a host where bubblewrap cannot make
namespaces (docs/ARCHITECTURE.md "Hosts without user namespaces", planned). Standard library only.

A ruleset names the accesses it handles; everything handled is denied but what a rule allows,
beneath a directory (rules add up along a path: a right given on a directory cannot be taken
back on a file under it) or on a TCP port. Once restrict() is called the process and all it
starts keep the ruleset for good, with no way to undo or widen it. Unlike a mount namespace,
Landlock cannot show a path as something else: a hidden file is unreadable, not replaced.

    rs = Ruleset(abi())                 # handles what this kernel knows
    rs.allow_path("/usr", READ)
    rs.allow_path(project, READ | WRITE)
    rs.allow_port(3128)                 # TCP connect to this port, on any address
    rs.restrict()                       # then exec the command
"""

import ctypes
import os

# x86-64 and the generic table (arm64, riscv64) share these numbers
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38

# filesystem rights (ABI 1 unless said)
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER = 1 << 13         # ABI 2: link or rename across directories
TRUNCATE = 1 << 14      # ABI 3
IOCTL_DEV = 1 << 15     # ABI 5
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
# network rights (ABI 4)
BIND_TCP, CONNECT_TCP = 1 << 0, 1 << 1
# scopes (ABI 6): no connect to an abstract unix socket, no signal, outside the domain
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ = EXECUTE | READ_FILE | READ_DIR
# a writable tree: everything but device nodes (MAKE_CHAR, MAKE_BLOCK stay refused)
WRITE = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO
         | MAKE_SYM | REFER | TRUNCATE)
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV   # what a rule on a file may hold


class LandlockError(OSError):
    pass


_libc: list = []


def _lib():
    if not _libc:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        _libc.append(lib)
    return _libc[0]


def _syscall(nr, *args):
    r = _lib().syscall(ctypes.c_long(nr), *args)
    if r < 0:
        e = ctypes.get_errno()
        raise LandlockError(e, os.strerror(e))
    return r


def abi() -> int:
    """The Landlock ABI this kernel offers: 0 when it has none (too old, or not enabled in the
    boot's `lsm=` list)."""
    try:
        return _syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (LandlockError, OSError, AttributeError):
        return 0


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


class Ruleset:
    """What the step may touch: handles every filesystem right of `version` (and TCP bind and
    connect from ABI 4, the abstract-socket and signal scopes from ABI 6)."""

    def __init__(self, version: int):
        if version < 1:
            raise LandlockError(0, "this kernel has no Landlock")
        self.version = version
        self.fs = FS_BY_ABI.get(version, FS_BY_ABI[5])
        self.net = BIND_TCP | CONNECT_TCP if version >= 4 else 0
        self.scoped = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if version >= 6 else 0
        attr = _RulesetAttr(self.fs, self.net, self.scoped)
        size = ctypes.sizeof(attr) if version >= 6 else 16 if version >= 4 else 8
        self.fd = _syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
        self.paths: list[tuple[str, int]] = []
        self.ports: list[int] = []

    def allow_path(self, path: str, rights: int) -> bool:
        """Allow `rights` beneath `path` (on a file: only the rights a file can have). False
        when the path does not exist (nothing to allow)."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            if not os.path.isdir(path):
                rights &= FILE_RIGHTS
            rule = _PathBeneath(rights & self.fs, fd)
            _syscall(ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(rule),
                     ctypes.c_uint32(0))
        finally:
            os.close(fd)
        self.paths.append((path, rights))
        return True

    def allow_port(self, port: int) -> None:
        """TCP connect to `port` (on any address: Landlock's port rules know no address)."""
        if not self.net:
            raise LandlockError(0, f"Landlock ABI {self.version} has no network rules (4 needed)")
        rule = _NetPort(CONNECT_TCP, port)
        _syscall(ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(RULE_NET_PORT), ctypes.byref(rule), ctypes.c_uint32(0))
        self.ports.append(port)

    def restrict(self) -> None:
        """This process and all it starts keep the ruleset from now on (no_new_privs first, as
        Landlock asks of a process without CAP_SYS_ADMIN)."""
        if _lib().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise LandlockError(e, os.strerror(e))
        _syscall(RESTRICT_SELF, ctypes.c_int(self.fd), ctypes.c_uint32(0))
        os.close(self.fd)
        self.fd = -1
