"""The seccomp filter bwrap installs before exec'ing a step: a few lines of classic BPF, built
here with struct so the hot path needs no library.

It refuses what namespaces do not cover:
- TIOCSTI and TIOCLINUX ioctls: pushing keystrokes into the caller's terminal, which the
  sandbox shares (kernel `dev.tty.legacy_tiocsti` is 1 on many distributions);
- every syscall of a foreign ABI (i386, x32) on x86-64, so the filter cannot be sidestepped
  by calling the same ioctl through another syscall table;
- the kernel keyring calls (add_key, request_key, keyctl), as Docker's default profile does:
  bwrap joins a fresh session keyring, but keys are found by serial number (/proc/keys lists
  them) and a key or keyring whose owner is host uid 0 grants its user permissions to a root
  step, so the caller's keys would be readable and its keyrings writable. Nothing a step needs
  uses them; they fail with EPERM.
- setting a setuid or setgid bit, by every call that takes a mode: chmod, fchmod, fchmodat,
  fchmodat2 with mode & 06000, and open, openat, creat, mkdir, mkdirat, mknod, mknodat when
  they create (O_CREAT or O_TMPFILE; creat, mkdir and mknod always) with mode & 06000: EPERM.
  A root step is host uid 0 (caps dropped do not matter to the bit: the file's owner may set
  it), and bwrap's nosuid mounts hold only inside its namespace: a step's `chmod 4755` of a
  copied shell would be a root shell for every user of the host. A user's step likewise would
  plant a program that runs as that user for anyone. openat2 takes its mode inside a struct
  the filter cannot read, and io_uring opens files with a mode from a ring in memory: both are
  refused with ENOSYS, as by a kernel without them (libc and runtimes fall back to openat).
  The other ways a mode reaches the disk keep no such bit: chown and a write by anyone but
  root-with-CAP_FSETID clear it, and setxattr of file capabilities needs CAP_SETFCAP.
Nested user namespaces are refused by bwrap's own --disable-userns.
"""

import errno
import os
import struct

_LD_W_ABS = 0x20      # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15         # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35         # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06         # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000

TIOCSTI = 0x5412
TIOCLINUX = 0x541C

_JSET_K = 0x45        # BPF_JMP | BPF_JSET | BPF_K

SPECIAL_BITS = 0o6000                   # S_ISUID | S_ISGID
CREATES = 0o100 | 0o20000000            # O_CREAT | __O_TMPFILE (the same on x86-64 and arm64)

# machine -> (AUDIT_ARCH, ioctl syscall number, first number of a foreign ABI or None,
#             refused syscalls: add_key, request_key, keyctl,
#             calls whose argument i is a mode, as (nr, i): chmod, fchmod, fchmodat, fchmodat2,
#             creat, mkdir, mkdirat, mknod, mknodat,
#             calls that create with flags in argument f and a mode in m, as (nr, f, m): open, openat,
#             calls refused as absent (ENOSYS): openat2, io_uring_setup)
_ARCHES = {
    "x86_64": (0xC000003E, 16, 0x40000000, (248, 249, 250),
               ((90, 1), (91, 1), (268, 2), (452, 2), (85, 1), (83, 1), (258, 2), (133, 1), (259, 2)),
               ((2, 1, 2), (257, 2, 3)), (437, 425)),
    "aarch64": (0xC00000B7, 29, None, (217, 218, 219),
                ((52, 1), (53, 2), (452, 2), (34, 2), (33, 2)),
                ((56, 2, 3),), (437, 425)),
}

# offsets in struct seccomp_data: nr (u32), arch (u32), ip (u64), args[6] (u64); an argument's
# low word comes first on these little-endian machines (a mode or flags is 32 bits or less)
_NR, _ARCH = 0, 4


def _arg_lo(i):
    return 16 + 8 * i


def _op(code, k, jt=0, jf=0):
    return struct.pack("=HBBI", code, jt, jf, k)


def returning(nrs, action) -> list[bytes]:
    """Each syscall of `nrs` returns `action` (the syscall number is in the accumulator)."""
    return [op for nr in nrs for op in (_op(_JEQ_K, nr, jt=0, jf=1), _op(_RET_K, action))]


# socket(2), socketpair(2) and listen(2), for the Landlock backend's socket rules
_SOCKET_CALLS = {"x86_64": (41, 53, 50), "aarch64": (198, 199, 201)}
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK, IPPROTO_TCP, NETLINK_ROUTE = 1, 5, 0xF, 6, 0
_ALU_AND_K = 0x54     # BPF_ALU | BPF_AND | BPF_K


def _assemble(items) -> list[bytes]:
    """Classic BPF from (code, k, jump-if-true label, jump-if-false label) and label names:
    a label is the next instruction's place; None jumps to the next instruction."""
    at, n = {}, 0
    for it in items:
        if isinstance(it, str):
            at[it] = n
        else:
            n += 1
    out, n = [], 0
    for it in items:
        if isinstance(it, str):
            continue
        code, k, t, f = it
        jt = at[t] - n - 1 if t else 0
        jf = at[f] - n - 1 if f else 0
        out.append(_op(code, k, jt, jf))
        n += 1
    return out


def _sockets_tcp_only(socket_nr, pair_nr, listen_nr):
    """Where there is no network namespace (the Landlock backend), a new socket may only be a
    TCP one, which Landlock's port rules judge, or a NETLINK_ROUTE one (the host's addresses;
    another netlink protocol, NETLINK_USERSOCK, carries messages to any process of the host):
    a unix socket could connect to any socket file of the host by its path (the person's
    ssh-agent, /run/docker.sock), which Landlock's filesystem rules do not judge, and UDP or
    raw sockets reach any address. A unix socketpair(2) stays, as a stream or seqpacket one
    only (a datagram end can still be sent to any socket file by path). listen(2) is refused:
    a socket listened on without bind(2) is bound by the kernel to a port of every address,
    which Landlock's bind rule never sees."""
    refuse = _ERRNO | errno.EACCES
    ld, eq, ret = _LD_W_ABS, _JEQ_K, _RET_K
    return _assemble([
        (eq, listen_nr, "refuse", None),
        (eq, pair_nr, "pair", None),
        (eq, socket_nr, None, "done"),
        (ld, _arg_lo(0), None, None),
        (eq, AF_NETLINK, "netlink", None),
        (eq, AF_INET, "inet", None),
        (eq, AF_INET6, "inet", None),
        (ret, _ERRNO | errno.EAFNOSUPPORT, None, None),
        "netlink",
        (ld, _arg_lo(2), None, None),
        (eq, NETLINK_ROUTE, "allow", "refuse"),
        "inet",
        (ld, _arg_lo(1), None, None),
        (_ALU_AND_K, SOCK_TYPE_MASK, None, None),
        (eq, SOCK_STREAM, None, "refuse"),
        (ld, _arg_lo(2), None, None),
        (eq, 0, "allow", None),
        (eq, IPPROTO_TCP, "allow", "refuse"),
        "pair",
        (ld, _arg_lo(0), None, None),
        (eq, AF_UNIX, None, "refuse"),
        (ld, _arg_lo(1), None, None),
        (_ALU_AND_K, SOCK_TYPE_MASK, None, None),
        (eq, SOCK_STREAM, "allow", None),
        (eq, SOCK_SEQPACKET, "allow", "refuse"),
        "refuse",
        (ret, refuse, None, None),
        "allow",
        (ret, _ALLOW, None, None),
        "done",
    ])


# What a Landlock step may not call at all, as absent (ENOSYS) or refused (EPERM): x86-64, aarch64.
# System V IPC and POSIX message queues are reached by key or name, not by a path Landlock
# judges, and no IPC namespace keeps the host's apart; a namespace of its own (unshare, setns,
# clone with a CLONE_NEW* flag; clone3's flags are in memory the filter cannot read, so clone3
# is absent and libc falls back to clone) is what bwrap's --disable-userns refuses.
_NO_NAMESPACE_CALLS = {
    "x86_64": {"absent": (29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220, 240, 241, 242, 243, 244, 245, 435),
               "refused": (272, 308), "clone": 56},
    "aarch64": {"absent": (186, 187, 188, 189, 190, 191, 192, 193, 194, 195, 196, 197,
                           180, 181, 182, 183, 184, 185, 435),
                "refused": (97, 268), "clone": 220},
}
CLONE_NAMESPACES = 0x20000 | 0x4000000 | 0x8000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x2000000 | 0x80


def _no_ipc_or_namespaces(calls):
    deny, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    ops = returning(calls["absent"], enosys) + returning(calls["refused"], deny)
    ops += _assemble([
        (_JEQ_K, calls["clone"], None, "done"),
        (_LD_W_ABS, _arg_lo(0), None, None),
        (_JSET_K, CLONE_NAMESPACES, "deny", "reload"),
        "deny",
        (_RET_K, deny, None, None),
        "reload",
        (_LD_W_ABS, _NR, None, None),
        "done",
    ])
    return ops


# Calls that act on another process by its pid, which Landlock's scopes (signals, ptrace) do
# not cover: a Landlock step may make them on itself only (pid 0): prlimit64, sched_setaffinity,
# sched_setparam, sched_setscheduler, sched_setattr, migrate_pages, move_pages (pid in argument 0);
# setpriority and ioprio_set (which, who): on the caller alone. The launcher, the daemon and the
# person's other processes are otherwise the step's to starve (RLIMIT_NOFILE 0), renice or pin.
_OTHER_PROCESS_CALLS = {
    "x86_64": {"pid0": (302, 203, 142, 144, 314, 256, 279), "prio": ((141, 0), (251, 1)), "ioctl": 16},
    "aarch64": {"pid0": (261, 122, 118, 119, 274, 238, 239), "prio": ((140, 0), (30, 1)), "ioctl": 29},
}
# The inode-flag ioctls (chattr's FS_IOC_SETFLAGS and its 32-bit form, FS_IOC_FSSETXATTR, the
# version ones): a file's owner may set them on any file it can open, read-only too, and no
# Landlock right covers them outside device files.
FS_FLAG_IOCTLS = (0x40086602, 0x40046602, 0x401C5820, 0x40087602, 0x40047602)


def _own_process_only(calls):
    deny = _ERRNO | errno.EPERM
    items: list = []
    for nr in calls["pid0"]:
        items += [(_JEQ_K, nr, None, f"after{nr}"), (_LD_W_ABS, _arg_lo(0), None, None),
                  (_JEQ_K, 0, "reload", "deny"), f"after{nr}"]
    for nr, self_which in calls["prio"]:
        items += [(_JEQ_K, nr, None, f"after{nr}"), (_LD_W_ABS, _arg_lo(0), None, None),
                  (_JEQ_K, self_which, None, "deny"), (_LD_W_ABS, _arg_lo(1), None, None),
                  (_JEQ_K, 0, "reload", "deny"), f"after{nr}"]
    items += [(_JEQ_K, calls["ioctl"], None, "done"), (_LD_W_ABS, _arg_lo(1), None, None)]
    for req in FS_FLAG_IOCTLS[:-1]:
        items.append((_JEQ_K, req, "deny", None))
    items += [(_JEQ_K, FS_FLAG_IOCTLS[-1], "deny", "reload"),
              "deny", (_RET_K, deny, None, None),
              "reload", (_LD_W_ABS, _NR, None, None),
              "done"]
    return _assemble(items)


def program(machine: str | None = None, sockets_tcp_only: bool = False) -> bytes | None:
    """The filter for this machine (or `machine`, as `uname -m` names it), or None where the
    architecture is not known. `sockets_tcp_only`: the Landlock backend's socket rules too."""
    machine = machine or os.uname().machine
    arch = _ARCHES.get(machine)
    if arch is None:
        return None
    audit_arch, ioctl_nr, foreign, refused, mode_calls, open_calls, absent = arch
    deny = _ERRNO | errno.EPERM
    enosys = _ERRNO | errno.ENOSYS
    ops = [
        _op(_LD_W_ABS, _ARCH),
        _op(_JEQ_K, audit_arch, jt=1),      # our ABI: go on; else fall into the deny below
        _op(_RET_K, deny),
        _op(_LD_W_ABS, _NR),
    ]
    if sockets_tcp_only:                # the Landlock backend: no namespace does these for it
        ops += _sockets_tcp_only(*_SOCKET_CALLS[machine])
        ops.append(_op(_LD_W_ABS, _NR))
        ops += _no_ipc_or_namespaces(_NO_NAMESPACE_CALLS[machine])
        ops += _own_process_only(_OTHER_PROCESS_CALLS[machine])
    if foreign is not None:
        ops += [_op(_JGE_K, foreign, jt=0, jf=1), _op(_RET_K, deny)]
    ops += returning(refused, deny) + returning(absent, enosys)
    for nr, m in mode_calls:                # a setuid/setgid bit in the mode: refused
        ops += [_op(_JEQ_K, nr, jt=0, jf=4),
                _op(_LD_W_ABS, _arg_lo(m)),
                _op(_JSET_K, SPECIAL_BITS, jt=0, jf=1),
                _op(_RET_K, deny),
                _op(_RET_K, _ALLOW)]
    for nr, f, m in open_calls:             # the same when the call creates
        ops += [_op(_JEQ_K, nr, jt=0, jf=6),
                _op(_LD_W_ABS, _arg_lo(f)),
                _op(_JSET_K, CREATES, jt=0, jf=3),
                _op(_LD_W_ABS, _arg_lo(m)),
                _op(_JSET_K, SPECIAL_BITS, jt=0, jf=1),
                _op(_RET_K, deny),
                _op(_RET_K, _ALLOW)]
    ops += [
        _op(_JEQ_K, ioctl_nr, jt=1),        # ioctl: look at its request; else allow
        _op(_RET_K, _ALLOW),
        _op(_LD_W_ABS, _arg_lo(1)),           # the request is an unsigned int: the low word
        _op(_JEQ_K, TIOCSTI, jt=2),
        _op(_JEQ_K, TIOCLINUX, jt=1),
        _op(_RET_K, _ALLOW),
        _op(_RET_K, deny),
    ]
    return b"".join(ops)
