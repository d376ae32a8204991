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

# machine -> (AUDIT_ARCH, ioctl syscall number, first number of a foreign ABI or None,
#             refused syscalls: add_key, request_key, keyctl)
_ARCHES = {
    "x86_64": (0xC000003E, 16, 0x40000000, (248, 249, 250)),
    "aarch64": (0xC00000B7, 29, None, (217, 218, 219)),
}

# offsets in struct seccomp_data: nr (u32), arch (u32), ip (u64), args[6] (u64)
_NR, _ARCH, _ARG1_LO = 0, 4, 24


def _op(code, k, jt=0, jf=0):
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes | None:
    """The filter for this machine, or None where the architecture is not known."""
    arch = _ARCHES.get(os.uname().machine)
    if arch is None:
        return None
    audit_arch, ioctl_nr, foreign, refused = arch
    deny = _ERRNO | errno.EPERM
    ops = [
        _op(_LD_W_ABS, _ARCH),
        _op(_JEQ_K, audit_arch, jt=1),      # our ABI: go on; else fall into the deny below
        _op(_RET_K, deny),
        _op(_LD_W_ABS, _NR),
    ]
    if foreign is not None:
        ops += [_op(_JGE_K, foreign, jt=0, jf=1), _op(_RET_K, deny)]
    for nr in refused:
        ops += [_op(_JEQ_K, nr, jt=0, jf=1), _op(_RET_K, deny)]
    ops += [
        _op(_JEQ_K, ioctl_nr, jt=1),        # ioctl: look at its request; else allow
        _op(_RET_K, _ALLOW),
        _op(_LD_W_ABS, _ARG1_LO),           # the request is an unsigned int: the low word
        _op(_JEQ_K, TIOCSTI, jt=2),
        _op(_JEQ_K, TIOCLINUX, jt=1),
        _op(_RET_K, _ALLOW),
        _op(_RET_K, deny),
    ]
    return b"".join(ops)
